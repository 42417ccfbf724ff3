#include "server/job_scrub.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "optimizer/sha256.h"
#include "server/job_files.h"
#include "server/log.h"

namespace onnxopt::server {
namespace fs = std::filesystem;

JobScrub::Findings JobScrub::Scrub() {
  Findings findings;
  ScrubBlobs(findings);
  absl::StatusOr<std::vector<v1::Job>> all = services_.store->All();
  if (!all.ok()) {
    Log(LogLevel::kError, absl::StrCat("scrub of artifacts skipped: ", all.status().ToString()));
    return findings;
  }
  for (const v1::Job& job : *all) {
    if (job.state() == v1::SUCCEEDED) ScrubArtifacts(job, findings);
  }
  return findings;
}

void JobScrub::ScrubBlobs(Findings& findings) {
  services_.blobs->ForEach([&](const std::string& tenant, BlobStore& store) {
    for (const std::string& digest : store.BlobsOlderThan(std::chrono::seconds(0))) {
      // Hashed without the lock (it may take a while); removed under it after hashing again.
      absl::StatusOr<std::string> actual = Sha256OfFile(store.PathOf(digest));
      if (!actual.ok()) continue;  // removed meanwhile
      ++findings.blobs_checked;
      std::error_code error;
      const auto size = fs::file_size(store.PathOf(digest), error);
      if (!error) findings.bytes_read += static_cast<int64_t>(size);
      if (*actual == digest) continue;
      std::lock_guard<std::mutex> lock(blob_lock_);
      if (!store.RemoveIfCorrupt(digest)) continue;
      findings.corrupt_blobs.push_back(absl::StrCat(tenant, "/", digest));
      services_.metrics->CorruptFound("blob");
      Log(LogLevel::kError, absl::StrCat("scrub: blob ", digest, (tenant.empty() ? "" : " of tenant " + tenant),
                                         " no longer matches its SHA-256 and was deleted; its next upload stores it "
                                         "again"));
    }
  });
}

void JobScrub::ScrubArtifacts(const v1::Job& job, Findings& findings) {
  const fs::path folder = services_.folders.Output(job.name());
  for (const v1::Artifact& artifact : job.result().artifacts()) {
    if (artifact.corrupt() || artifact.sha256().empty()) continue;
    absl::StatusOr<std::string> actual = Sha256OfFile(folder / artifact.name());
    if (!actual.ok()) continue;  // deleted meanwhile (Download says the file is gone)
    ++findings.artifacts_checked;
    findings.bytes_read += artifact.size();
    if (*actual == artifact.sha256()) continue;
    if (absl::Status marked = MarkArtifactCorrupt(job.name(), artifact.name()); !marked.ok()) {
      Log(LogLevel::kError, absl::StrCat("scrub: cannot mark ", job.name(), "/", artifact.name(), " corrupt: ",
                                         marked.ToString()),
          {job.name(), job.tenant()});
      continue;
    }
    findings.corrupt_artifacts.push_back(absl::StrCat(job.name(), "/", artifact.name()));
  }
}

absl::Status JobScrub::MarkArtifactCorrupt(const std::string& job_name, const std::string& artifact) {
  bool applied = false;
  absl::StatusOr<v1::Job> updated = services_.store->Modify(
      job_name,
      [&](v1::Job& job) {
        if (!job.has_result()) return false;
        for (v1::Artifact& entry : *job.mutable_result()->mutable_artifacts()) {
          if (entry.name() != artifact || entry.corrupt()) continue;
          entry.set_corrupt(true);
          return true;
        }
        return false;
      },
      &applied);
  if (!updated.ok()) return updated.status();
  if (applied) {
    services_.metrics->CorruptFound("artifact");
    Log(LogLevel::kError,
        absl::StrCat(job_name, "/", artifact, " no longer matches its SHA-256; its downloads are refused"),
        {job_name, updated->tenant()});
  }
  return absl::OkStatus();
}

}  // namespace onnxopt::server
