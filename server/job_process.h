// Runs one job's risky work (parsing an untrusted model, ONNX Runtime sessions) in an onnxopt-worker
// child process with a memory limit and a time limit. A crash, an out-of-memory kill or a hang fails
// that job with a reason; the server carries on.
#ifndef ONNXOPT_SERVER_JOB_PROCESS_H_
#define ONNXOPT_SERVER_JOB_PROCESS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>

#include "absl/status/status.h"
#include "server/worker_protocol.h"

namespace onnxopt::server {

struct WorkerLimits {
  std::filesystem::path binary;             // onnxopt-worker
  int64_t memory_limit_mb = 0;               // address-space limit of the child; 0: none
  std::chrono::seconds timeout{3600};        // wall time, then JOB_TIMEOUT
  std::chrono::seconds cancel_grace{10};     // after SIGTERM, how long before SIGKILL
};

// The worker's own final status, or: CANCELLED (cancel set), DEADLINE_EXCEEDED (JOB_TIMEOUT),
// RESOURCE_EXHAUSTED / INTERNAL (WORKER_CRASHED) when it died without reporting.
// `inputs` is the manifest of inputs supplied with the job (worker_protocol.h), or empty.
absl::Status RunWorkerProcess(const WorkerLimits& limits, const std::filesystem::path& model,
                              const std::filesystem::path& output_dir, const std::filesystem::path& config,
                              const std::filesystem::path& inputs, const std::atomic<bool>& cancel,
                              const std::function<void(const WorkerLine&)>& on_progress);

// The onnxopt-worker next to the running executable.
std::filesystem::path DefaultWorkerBinary();

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_PROCESS_H_
