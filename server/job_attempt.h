// One attempt of a job this replica claimed, run as a table of stages (like OptimizeJob::Run):
//
//   stage     the attempt's own folder: the job's blobs linked in, its config, the digest manifest
//   work      the onnxopt-worker process; its progress lines become the job's progress
//   keep      whether the attempt still counts: dropped when its lease was lost, back to QUEUED when
//             shutdown interrupted it; altered blobs removed
//   ingest    the worker's report read (a success without one fails), stamped and written
//   hash      each artifact's size and SHA-256, the result's figures
//   fence     the lease renewed: only the attempt that still holds the job publishes
//   publish   the output folder renamed into place, durable before the record names it
//   finish    the job ended in the store under the same fence
//
// A stage that ends the attempt stops the table; the attempt's folder never outlives it.
#ifndef ONNXOPT_SERVER_JOB_ATTEMPT_H_
#define ONNXOPT_SERVER_JOB_ATTEMPT_H_

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "onnxopt/v1/report.pb.h"
#include "onnxopt/v1/service.pb.h"
#include "server/job_services.h"

namespace onnxopt::server {

// The flags of an attempt running here, shared with the lease loop, Cancel and Drain.
struct AttemptFlags {
  std::string token;  // its lease (LeaseToken)
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<bool>> lease_lost = std::make_shared<std::atomic<bool>>(false);
};

class JobAttempt {
 public:
  // `interrupting`: shutdown is stopping running jobs (they go back to the queue).
  JobAttempt(const JobServices& services, v1::Job job, AttemptFlags flags, const std::atomic<bool>& interrupting);
  void Run();

 private:
  enum class Next { kGoOn, kStop };
  Next StageInputs();
  Next Work();
  Next Keep();
  Next IngestReport();
  Next HashArtifacts();
  Next Fence();
  Next Publish();
  Next Finish();

  absl::Status PrepareInputs() const;
  // Puts the interrupted job back in the queue (or ends it, when its cancellation was asked meanwhile).
  void Requeue();
  // Store updates whose failure must not stop the job (progress, state moves): logged, not returned.
  void ModifyIfHeld(const std::function<void(v1::Job&)>& mutate);
  void RemoveCorruptBlobs() const;
  void RemoveAttemptFolder() const;
  std::filesystem::path InputManifest() const { return input_dir_ / kStagedInputsFolder / "manifest.tsv"; }
  std::filesystem::path DigestManifest() const { return input_dir_ / kDigestManifestName; }

  const JobServices services_;
  const v1::Job job_;
  const AttemptFlags flags_;
  const std::atomic<bool>& interrupting_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const std::filesystem::path attempt_dir_, input_dir_, output_dir_;
  absl::Status outcome_;   // the job's outcome so far
  double seconds_ = 0;     // from the claim to the worker's end
  v1::Report report_;      // the worker's, stamped
  v1::JobResult result_;   // artifacts and figures
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_ATTEMPT_H_
