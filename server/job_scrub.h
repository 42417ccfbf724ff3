// Finds bytes that rotted on disk before anyone is served them. A scrub reads every stored blob (named
// by its SHA-256) and every artifact of a succeeded job (its recorded SHA-256) and compares:
//   - a corrupt blob is deleted: the next upload of the model stores it anew, and a queued job that
//     needed it fails with BLOB_CORRUPT when it checks its inputs, as it would had it found it itself;
//   - a corrupt artifact is marked in its job's record (Artifact.corrupt): Download refuses it with
//     DATA_LOSS (ARTIFACT_CORRUPT), and GetJob shows it.
// The server scrubs at start and then on a schedule (--scrub-interval-hours). Download also checks an
// artifact it streams whole and marks it the same way when its bytes do not match.
#ifndef ONNXOPT_SERVER_JOB_SCRUB_H_
#define ONNXOPT_SERVER_JOB_SCRUB_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/job_services.h"

namespace onnxopt::server {

class JobScrub {
 public:
  // `blob_lock` is JobAdmission's: a blob is only removed while no CreateJob can start using it.
  JobScrub(const JobServices& services, std::mutex& blob_lock) : services_(services), blob_lock_(blob_lock) {}

  struct Findings {
    int blobs_checked = 0;
    int artifacts_checked = 0;
    int64_t bytes_read = 0;
    std::vector<std::string> corrupt_blobs;      // "<tenant>/<sha256>" ("" tenant: the shared store)
    std::vector<std::string> corrupt_artifacts;  // "jobs/<id>/<artifact>"
  };
  Findings Scrub();

  // Marks `artifact` of `job_name` corrupt in the job's record (and counts it); OK when already marked.
  absl::Status MarkArtifactCorrupt(const std::string& job_name, const std::string& artifact);

 private:
  void ScrubBlobs(Findings& findings);
  void ScrubArtifacts(const v1::Job& job, Findings& findings);

  const JobServices services_;
  std::mutex& blob_lock_;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_SCRUB_H_
