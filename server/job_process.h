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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/worker_protocol.h"

namespace onnxopt::server {

struct WorkerLimits {
  std::filesystem::path binary;             // onnxopt-worker
  int64_t memory_limit_mb = 0;               // address-space limit of the child; 0: none
  std::chrono::seconds timeout{3600};        // wall time, then JOB_TIMEOUT
  std::chrono::seconds cancel_grace{10};     // after SIGTERM, how long before SIGKILL
};

// One run of the worker binary: its arguments, and the folder it runs in. The child's working
// directory is `folder` and its TMPDIR is `folder`/tmp, so nothing it or ONNX Runtime resolves against
// either (a relative external-data path, ONNX Runtime's own log files) reaches outside it.
struct WorkerRun {
  std::vector<std::string> args;
  std::filesystem::path folder;
  std::filesystem::path log;  // where the child's stderr goes; empty: nowhere
  std::chrono::seconds timeout{3600};
  // Bytes of files the worker maps rather than holds, added to the address-space limit (see
  // WorkerAddressSpaceBytes).
  int64_t mapped_bytes = 0;
};

// The address-space limit of a worker given `memory_limit_mb` (0: none) and a model whose folder holds
// `model_bytes`: the limit plus twice those bytes. ONNX Runtime maps a model's external data instead of
// copying it (the original's, then the result's, at most as big), and mapped file pages count against the
// address space although the kernel may drop them: without the allowance a model larger than the limit
// (a 7B decoder's 29 GB under the default 16 GiB) could not even be opened, while what the job itself
// allocates stays bounded by the configured limit.
int64_t WorkerAddressSpaceBytes(int64_t memory_limit_mb, int64_t model_bytes);

// The worker's own final status, or: CANCELLED (cancel set), DEADLINE_EXCEEDED (JOB_TIMEOUT),
// INTERNAL (WORKER_CRASHED) when it died without reporting. Every line it prints goes to on_line.
absl::Status RunWorker(const WorkerLimits& limits, const WorkerRun& run, const std::atomic<bool>& cancel,
                       const std::function<void(const WorkerLine&)>& on_line);

// One job: the model and its files under `job_dir`/input (`inputs`: the supplied-input manifest or
// empty; `digests`: the SHA-256 manifest the worker checks the files against), results in `output_dir`.
struct WorkerJob {
  std::filesystem::path job_dir;
  std::filesystem::path model;
  std::filesystem::path output_dir;
  std::filesystem::path config;
  std::filesystem::path inputs;
  std::filesystem::path digests;
  std::string name;  // "jobs/<id>", stamped into the delivered model's metadata
};
absl::Status RunWorkerProcess(const WorkerLimits& limits, const WorkerJob& job, const std::atomic<bool>& cancel,
                              const std::function<void(const WorkerLine&)>& on_progress);

// Parses the model file in a worker (the server never holds an uploaded model in its own memory) and
// returns the external data files it names; INVALID_ARGUMENT (MODEL_PARSE_FAILED) for a file that is
// no model. `folder` is an empty folder the worker may run in.
absl::StatusOr<std::vector<std::string>> InspectModel(const WorkerLimits& limits, const std::filesystem::path& model,
                                                      const std::filesystem::path& folder);

// The onnxopt-worker next to the running executable.
std::filesystem::path DefaultWorkerBinary();

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_PROCESS_H_
