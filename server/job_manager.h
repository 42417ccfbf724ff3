// Owns the life of jobs on a replica: its worker threads, their wake-ups, the leases of the jobs running
// here, cancellation and drain. The stages of a job's life are their own classes, which it owns:
//   JobAdmission  (job_admission.h)  checks and stores new jobs, retries, the result cache, quotas
//   JobAttempt    (job_attempt.h)    one attempt of a claimed job, as a stage table
//   JobRetention  (job_retention.h)  deletion and garbage collection
//   JobScrub      (job_scrub.h)      stored bytes checked against their digests
// Every job it starts ends SUCCEEDED, FAILED or CANCELLED, or, when shutdown interrupts it, goes back to
// QUEUED to run again (here at the next start, or on another replica). Workers claim jobs from the store
// under a lease they renew while the job runs; a job whose replica died is taken back when its lease
// expires (see JobStore).
#ifndef ONNXOPT_SERVER_JOB_MANAGER_H_
#define ONNXOPT_SERVER_JOB_MANAGER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnxopt/v1/service.pb.h"
#include "server/job_admission.h"
#include "server/job_attempt.h"
#include "server/job_outcome.h"
#include "server/job_retention.h"
#include "server/job_scrub.h"
#include "server/job_services.h"

namespace onnxopt::server {

class JobManager {
 public:
  JobManager(JobManagerOptions options, JobStore* store, TenantBlobStores* blobs, Metrics* metrics);
  ~JobManager();

  // Takes back jobs whose lease expired (those a killed server left RUNNING, here or on a replica)
  // and starts the workers.
  absl::Status Start();
  // Queues a job owned by `tenant`, whose blobs it names.
  absl::StatusOr<v1::Job> Submit(const v1::CreateJobRequest& request, const std::string& tenant = "");
  absl::StatusOr<v1::Job> Cancel(const std::string& name);
  // Deletes a finished job: record, folder, and the blobs no other job of its tenant uses.
  // FAILED_PRECONDITION (JOB_NOT_DONE) for a queued or running job.
  absl::StatusOr<v1::DeleteJobResponse> Delete(const std::string& name);
  using Collected = JobRetention::Collected;
  // Retention and garbage collection, run by the server hourly: deletes jobs that ended more than
  // `retention` ago (0: keep them), then blobs no job uses that nobody wrote for `orphan_age` (an
  // upload is used by the job it was made for within that time), then job folders without a job that
  // nobody wrote for `orphan_age`.
  Collected CollectGarbage(std::chrono::seconds retention, std::chrono::seconds orphan_age);
  // Reads every stored blob and succeeded job's artifact against its SHA-256 (job_scrub.h).
  JobScrub::Findings Scrub() { return scrub_.Scrub(); }
  // Marks an artifact whose bytes no longer match; its downloads are refused.
  absl::Status MarkArtifactCorrupt(const std::string& job_name, const std::string& artifact) {
    return scrub_.MarkArtifactCorrupt(job_name, artifact);
  }
  // Stops taking jobs, lets running ones finish within `grace`, then interrupts the rest (they return
  // to QUEUED) and joins the workers. Jobs still queued stay queued for the next start or for others.
  void Drain(std::chrono::milliseconds grace);
  bool draining() const { return draining_.load(); }

  // Where a job's results live; artifacts are plain files in there.
  std::filesystem::path OutputDir(const std::string& job_name) const;
  const JobManagerOptions& options() const { return options_; }
  // Jobs queued in the store (0 when it cannot say).
  size_t queue_length() const { return static_cast<size_t>(store_->QueueLength().value_or(0)); }

 private:
  void WorkerLoop();
  // Renews the leases of the jobs running here and takes back expired ones, until shutdown.
  void LeaseLoop();
  void RenewLeases();
  void RecoverExpiredLeases();
  // Metrics of a job taken back from an expired lease.
  void CountRecovered(const v1::Job& job);
  // Wakes idle workers: a job was queued here (or taken back).
  void WakeWorkers(bool all);
  void UpdateQueueMetric();
  // Registers the attempt's flags (for the lease loop, Cancel and Drain), runs it, forgets them.
  void RunJob(const v1::Job& job);

  const JobManagerOptions options_;
  const JobServices services_;
  JobStore* const store_;
  Metrics* const metrics_;
  std::mutex blob_lock_;  // see JobAdmission
  std::atomic<bool> draining_{false};
  std::atomic<bool> interrupting_{false};
  JobAdmission admission_;
  JobRetention retention_;
  JobScrub scrub_;
  std::vector<std::thread> workers_;
  std::thread lease_thread_;
  std::mutex work_mutex_;
  std::condition_variable work_available_;  // a job was queued here, or draining began
  std::condition_variable lease_wake_;      // draining ended: the lease loop stops
  uint64_t queued_generation_ = 0;          // counts WakeWorkers calls; work_mutex_ held
  std::mutex flags_mutex_;
  std::map<std::string, AttemptFlags> running_jobs_;
  std::atomic<int> running_{0};  // workers claiming or running a job
  std::atomic<int> busy_{0};     // workers running a job
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_MANAGER_H_
