// Owns the life of jobs: checks and stores new ones, runs queued ones on worker threads through the
// optimizer, cancels, and drains on shutdown. Every job it starts ends SUCCEEDED, FAILED or CANCELLED,
// or, when shutdown interrupts it, goes back to QUEUED to run again (here at the next start, or on
// another replica). Workers claim jobs from the store under a lease they renew while the job runs;
// a job whose replica died is taken back when its lease expires (see JobStore).
#ifndef ONNXOPT_SERVER_JOB_MANAGER_H_
#define ONNXOPT_SERVER_JOB_MANAGER_H_

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnxopt/v1/service.pb.h"
#include "server/blob_store.h"
#include "server/job_process.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/tenants.h"

namespace onnxopt::server {

struct JobManagerOptions {
  std::filesystem::path data_dir;
  int workers = 2;
  size_t queue_capacity = 64;
  int max_active_jobs_per_tenant = 0;  // queued + running per tenant; 0: only the queue bounds them
  WorkerLimits worker;  // each job runs in an onnxopt-worker child under these limits
  // Scale-out (--role, --replica-id, --worker-device, --lease-seconds, --max-attempts).
  bool run_jobs = true;  // false: an API replica, which stores jobs for others to run
  std::string replica_id = "local";
  WorkerDevice device = WorkerDevice::kAny;
  std::chrono::seconds lease{30};
  int max_attempts = 3;
  // How often an idle worker looks for jobs other replicas queued (jobs queued here wake it at once).
  std::chrono::milliseconds poll{500};
};

// Tensors a job may bring for validation.
inline constexpr int kMaxSuppliedTensors = 1000;
// The range of OptimizationConfig.priority.
inline constexpr int32_t kMinPriority = -1000;
inline constexpr int32_t kMaxPriority = 1000;

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
  struct Collected {
    int jobs = 0;       // finished jobs past the retention time
    int blobs = 0;      // blobs no job uses, untouched for the orphan age
    int folders = 0;    // old job folders without a job (a deletion interrupted by a crash)
    int64_t bytes = 0;
  };
  // Retention and garbage collection, run by the server hourly: deletes jobs that ended more than
  // `retention` ago (0: keep them), then blobs no job uses that nobody wrote for `orphan_age` (an
  // upload is used by the job it was made for within that time), then job folders without a job that
  // nobody wrote for `orphan_age`.
  Collected CollectGarbage(std::chrono::seconds retention, std::chrono::seconds orphan_age);
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
  // A job this replica runs: the flag that stops its worker process, and whether its lease was lost.
  struct RunningJob {
    std::string token;  // its lease (LeaseToken)
    std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<std::atomic<bool>> lease_lost = std::make_shared<std::atomic<bool>>(false);
  };
  // Store updates whose failure must not stop the job (progress, state moves): logged, not returned.
  void ModifyOrLog(const std::string& name, const std::function<bool(v1::Job&)>& mutate);
  void WorkerLoop();
  // Renews the leases of the jobs running here and takes back expired ones, until shutdown.
  void LeaseLoop();
  void RecoverExpiredLeases();
  // Metrics of a job taken back from an expired lease.
  void CountRecovered(const v1::Job& job);
  // Wakes idle workers: a job was queued here (or taken back).
  void WakeWorkers(bool all);
  void UpdateQueueMetric();
  // `existing`, the job of `request`'s request id, if `request` repeats the one that made it.
  static absl::StatusOr<v1::Job> Retried(const v1::Job& existing, const v1::CreateJobRequest& request);
  void RunJob(const v1::Job& job);
  // Whether `stored` is still the attempt the lease `token` (LeaseToken at the claim) holds.
  static bool Holds(const v1::Job& stored, const std::string& token) {
    return stored.state() == v1::RUNNING && LeaseToken(stored) == token;
  }
  // Publishes an attempt's output folder as the job's.
  absl::Status PublishOutput(const std::string& name, const std::filesystem::path& attempt_output) const;
  absl::Status PrepareInputs(const v1::Job& job, const std::filesystem::path& input_dir) const;
  absl::Status ValidateRequest(const v1::CreateJobRequest& request, BlobStore& blobs) const;
  absl::Status ValidateInputs(const google::protobuf::RepeatedPtrField<v1::InputTensor>& inputs,
                              const BlobStore& blobs) const;
  // OK when `request` repeats the one that made `existing`; ALREADY_EXISTS (REQUEST_ID_REUSED) else.
  static absl::Status CheckRetry(const v1::Job& existing, const v1::CreateJobRequest& request);
  // After a worker found a stored blob altered: drop the job's blobs that no longer match their hash,
  // so the next upload of that file stores it again.
  void RemoveCorruptBlobs(const v1::Job& job);
  static std::filesystem::path InputManifest(const std::filesystem::path& input_dir);
  static std::filesystem::path DigestManifest(const std::filesystem::path& input_dir);
  // An empty folder the model inspection runs in.
  std::filesystem::path SandboxDir() const;
  // InspectModel on a stored blob, at most MaxInspections() at once (RESOURCE_EXHAUSTED after waiting
  // kInspectWait for a slot).
  absl::StatusOr<std::vector<std::string>> InspectModelBounded(const std::filesystem::path& model) const;
  int MaxInspections() const { return std::max(1, options_.workers); }
  static constexpr std::chrono::seconds kInspectWait{30};
  // Ends the attempt `token` holds of a job: SUCCEEDED with `result`, else FAILED or CANCELLED by
  // `status`. False when that attempt no longer holds the job (another took it over: its result counts).
  bool Finish(const std::string& name, const std::string& token, const absl::Status& status,
              const v1::JobResult* result, double seconds);
  // For a new job `job` (named, not yet stored) that repeats `source`: `source`'s result files linked
  // into the job's folder, its report marked as cached. nullopt (nothing kept) when the files are gone.
  std::optional<v1::JobResult> CopyCachedResult(const v1::Job& job, const v1::Job& source);
  // Deletes `job`'s record and the blobs no other job of its tenant uses, with submit_mutex_ held:
  // blobs are only removed while no CreateJob can start using them. The folder is left to the caller.
  // `usage`, when given, counts the jobs (`job` included) using each blob of each tenant, and is kept
  // up to date; without it the store is read for them.
  using BlobUsage = std::map<std::string, std::map<std::string, int>>;  // tenant -> digest -> jobs
  static BlobUsage CountBlobUsage(const std::vector<v1::Job>& jobs);
  absl::StatusOr<v1::DeleteJobResponse> DeleteLocked(const v1::Job& job, BlobUsage* usage = nullptr);
  // Removes a folder; the bytes it held.
  static int64_t RemoveFolder(const std::filesystem::path& folder);
  std::filesystem::path JobDir(const std::string& job_name) const;

  const JobManagerOptions options_;
  JobStore* const store_;
  TenantBlobStores* const blobs_;
  Metrics* const metrics_;
  std::vector<std::thread> workers_;
  std::thread lease_thread_;
  std::mutex work_mutex_;
  std::condition_variable work_available_;  // a job was queued here, or draining began
  std::condition_variable lease_wake_;      // draining ended: the lease loop stops
  uint64_t queued_generation_ = 0;          // counts WakeWorkers calls; work_mutex_ held
  std::mutex submit_mutex_;
  mutable std::mutex inspect_mutex_;
  mutable std::condition_variable inspect_slot_free_;
  mutable int inspections_ = 0;
  std::mutex flags_mutex_;
  std::map<std::string, RunningJob> running_jobs_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> interrupting_{false};
  std::atomic<int> running_{0};  // workers claiming or running a job
  std::atomic<int> busy_{0};     // workers running a job
};

// The result cache's key for a request: SHA-256 over the model and external data digests, the supplied
// inputs, the config in canonical form (priority and the cache flag cleared, deterministic encoding),
// and onnxopt's and ONNX Runtime's versions. The tenant is matched separately.
std::string ResultCacheKey(const v1::CreateJobRequest& request);

// Safe relative file name for an external data file: no absolute path, no "..", no empty parts.
bool IsSafeRelativeName(const std::string& name);
// Names the job folder uses itself, which external data files may not take.
bool IsReservedStagingName(const std::string& name);
// What differs between the request that made `existing` and `request` ("another model", ...), or "".
std::string RequestDifference(const v1::Job& existing, const v1::CreateJobRequest& request);
// Splits "REASON: text" status messages into (reason, text); reason falls back to the code's name.
std::pair<std::string, std::string> SplitReason(const absl::Status& status);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_MANAGER_H_
