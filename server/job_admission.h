// Admits new jobs: checks a CreateJob request (digests, blobs, names, config, inputs, and that the model
// parses, in a worker process), gives a retried request the job it made, serves a repeated one from the
// result cache, enforces the queue's capacity and the tenant's quota, and stores the job QUEUED.
#ifndef ONNXOPT_SERVER_JOB_ADMISSION_H_
#define ONNXOPT_SERVER_JOB_ADMISSION_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnxopt/v1/service.pb.h"
#include "server/job_services.h"

namespace onnxopt::server {

// Tensors a job may bring for validation.
inline constexpr int kMaxSuppliedTensors = 1000;
// The range of OptimizationConfig.priority.
inline constexpr int32_t kMinPriority = -1000;
inline constexpr int32_t kMaxPriority = 1000;

class JobAdmission {
 public:
  // `blob_lock` is held while a job is stored, and by JobRetention while it deletes blobs: a blob seen
  // here stays until the job that uses it is stored. `draining` refuses new jobs; `on_queued` wakes a
  // worker when one was queued.
  JobAdmission(const JobServices& services, std::mutex& blob_lock, const std::atomic<bool>& draining,
               std::function<void()> on_queued);

  // Queues a job owned by `tenant`, whose blobs it names; or the job an earlier identical request with
  // the same request id made; or a SUCCEEDED copy of a cached result.
  absl::StatusOr<v1::Job> Submit(const v1::CreateJobRequest& request, const std::string& tenant);

 private:
  // The job `request`'s request id made, if any (an error when the id was used for another request).
  std::optional<absl::StatusOr<v1::Job>> Earlier(const v1::CreateJobRequest& request, const std::string& tenant) const;
  absl::Status ValidateRequest(const v1::CreateJobRequest& request, BlobStore& blobs) const;
  absl::Status ValidateModelRef(const v1::ModelRef& model, const BlobStore& blobs) const;
  absl::Status ValidateInputs(const google::protobuf::RepeatedPtrField<v1::InputTensor>& inputs,
                              const BlobStore& blobs) const;
  // Parses the model in a worker process and checks that every external data file it names is listed.
  absl::Status CheckModelParses(const v1::ModelRef& model, BlobStore& blobs) const;
  // InspectModel on a stored blob, at most MaxInspections() at once (RESOURCE_EXHAUSTED after waiting
  // kInspectWait for a slot).
  absl::StatusOr<std::vector<std::string>> InspectModelBounded(const std::filesystem::path& model) const;
  int MaxInspections() const { return std::max(1, services_.options.workers); }
  // RESOURCE_EXHAUSTED when the tenant's quota or the queue is full; the queue's length otherwise.
  absl::StatusOr<int> CheckRoom(const std::string& tenant, bool cached) const;
  // Stores `job` SUCCEEDED with a copy of `cached`'s result; nullopt when `cached`'s files are gone.
  std::optional<absl::StatusOr<v1::Job>> ServeFromCache(const v1::Job& job, const v1::Job& cached,
                                                        const v1::CreateJobRequest& request);
  // For a new job `job` (named, not yet stored) that repeats `source`: `source`'s result files linked
  // into the job's folder, its report marked as cached. nullopt (nothing kept) when the files are gone.
  std::optional<v1::JobResult> CopyCachedResult(const v1::Job& job, const v1::Job& source) const;
  absl::StatusOr<v1::Job> Enqueue(v1::Job job, const v1::CreateJobRequest& request, int queued);

  static constexpr std::chrono::seconds kInspectWait{30};
  const JobServices services_;
  std::mutex& blob_lock_;
  const std::atomic<bool>& draining_;
  const std::function<void()> on_queued_;
  mutable std::mutex inspect_mutex_;
  mutable std::condition_variable inspect_slot_free_;
  mutable int inspections_ = 0;
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
// OK when `request` repeats the one that made `existing`; ALREADY_EXISTS (REQUEST_ID_REUSED) else.
absl::Status CheckRetry(const v1::Job& existing, const v1::CreateJobRequest& request);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_ADMISSION_H_
