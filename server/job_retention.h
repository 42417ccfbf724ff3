// What a replica keeps and for how long: deleting a finished job (record, folder, and the blobs no
// other job of its tenant uses), and the hourly garbage collection (jobs past the retention time,
// orphaned blobs, folders a crash left without a job).
#ifndef ONNXOPT_SERVER_JOB_RETENTION_H_
#define ONNXOPT_SERVER_JOB_RETENTION_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "onnxopt/v1/service.pb.h"
#include "server/job_services.h"

namespace onnxopt::server {

class JobRetention {
 public:
  // `blob_lock` is JobAdmission's: blobs are only removed while no CreateJob can start using them.
  JobRetention(const JobServices& services, std::mutex& blob_lock) : services_(services), blob_lock_(blob_lock) {}

  // Deletes a finished job: record, folder, and the blobs no other job of its tenant uses.
  // FAILED_PRECONDITION (JOB_NOT_DONE) for a queued or running job.
  absl::StatusOr<v1::DeleteJobResponse> Delete(const std::string& name);

  struct Collected {
    int jobs = 0;       // finished jobs past the retention time
    int blobs = 0;      // blobs no job uses, untouched for the orphan age
    int folders = 0;    // old job folders without a job (a deletion interrupted by a crash)
    int64_t bytes = 0;
  };
  // Deletes jobs that ended more than `retention` ago (0: keep them), then blobs no job uses that nobody
  // wrote for `orphan_age` (an upload is used by the job it was made for within that time), then job
  // folders without a job that nobody wrote for `orphan_age`.
  Collected CollectGarbage(std::chrono::seconds retention, std::chrono::seconds orphan_age);

 private:
  using BlobUsage = std::map<std::string, std::map<std::string, int>>;  // tenant -> digest -> jobs
  static BlobUsage CountBlobUsage(const std::vector<v1::Job>& jobs);
  // Deletes `job`'s record and the blobs no other job of its tenant uses, with blob_lock_ held. The
  // folder is left to the caller. `usage`, when given, counts the jobs (`job` included) using each blob
  // of each tenant, and is kept up to date; without it the store is read for them.
  absl::StatusOr<v1::DeleteJobResponse> DeleteLocked(const v1::Job& job, BlobUsage* usage = nullptr);
  // Job folders nobody wrote since `cutoff`.
  std::vector<std::filesystem::path> OldFolders(std::filesystem::file_time_type cutoff) const;
  // Deletes the jobs of `all` that ended before `retention` ago; their folders go to `folders`.
  void DeleteExpired(const std::vector<v1::Job>& all, std::chrono::seconds retention, Collected& collected,
                     std::vector<std::filesystem::path>& folders);
  // Removes the blobs no job of `all` uses that nobody wrote for `orphan_age`.
  void RemoveOrphanBlobs(const std::vector<v1::Job>& all, std::chrono::seconds orphan_age, Collected& collected);

  const JobServices services_;
  std::mutex& blob_lock_;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_RETENTION_H_
