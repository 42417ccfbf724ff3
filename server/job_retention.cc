#include "server/job_retention.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/time_util.h"
#include "optimizer/failure.h"
#include "server/log.h"

namespace onnxopt::server {
namespace fs = std::filesystem;

absl::StatusOr<v1::DeleteJobResponse> JobRetention::Delete(const std::string& name) {
  absl::StatusOr<v1::DeleteJobResponse> deleted;
  {
    std::lock_guard<std::mutex> lock(blob_lock_);
    absl::StatusOr<v1::Job> job = services_.store->Get(name);
    if (!job.ok()) return job.status();
    if (!IsTerminal(job->state())) {
      return Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::JOB_NOT_DONE,
                     absl::StrCat(name, " is ", v1::JobState_Name(job->state()), "; cancel it first"));
    }
    deleted = DeleteLocked(*job);
  }
  // The folder goes without the lock: with the record gone nothing reads it, and a crash before this
  // leaves a stray folder that garbage collection removes.
  if (deleted.ok()) deleted->set_bytes_freed(deleted->bytes_freed() + RemoveFolder(services_.folders.Job(name)));
  return deleted;
}

JobRetention::BlobUsage JobRetention::CountBlobUsage(const std::vector<v1::Job>& jobs) {
  BlobUsage usage;
  for (const v1::Job& job : jobs) {
    const std::vector<std::string> digests = BlobsOf(job);
    for (const std::string& digest : std::set<std::string>(digests.begin(), digests.end())) ++usage[job.tenant()][digest];
  }
  return usage;
}

absl::StatusOr<v1::DeleteJobResponse> JobRetention::DeleteLocked(const v1::Job& job, BlobUsage* usage) {
  // The record goes first: a crash after it leaves only files, which garbage collection finds.
  absl::Status deleted = services_.store->Delete(job.name());
  if (!deleted.ok()) return deleted;
  v1::DeleteJobResponse response;
  response.set_name(job.name());
  const std::vector<std::string> digests = BlobsOf(job);
  const std::set<std::string> distinct(digests.begin(), digests.end());
  BlobUsage counted;
  if (usage == nullptr) {
    absl::StatusOr<std::vector<v1::Job>> all = services_.store->All();  // without `job` now
    if (!all.ok()) {
      // Which blobs other jobs use is unknown: they stay, for garbage collection to judge later.
      Log(LogLevel::kWarning, absl::StrCat(job.name(), " deleted, its blobs kept: ", all.status().ToString()),
          {job.name(), job.tenant()});
      return response;
    }
    counted = CountBlobUsage(*all);
  } else {
    for (const std::string& digest : distinct) --(*usage)[job.tenant()][digest];  // the counts included `job`
  }
  std::map<std::string, int>& used = (usage != nullptr ? *usage : counted)[job.tenant()];
  absl::StatusOr<BlobStore*> blobs = services_.blobs->For(job.tenant());
  if (!blobs.ok()) return response;
  for (const std::string& digest : distinct) {
    if (used[digest] > 0) continue;
    const int64_t bytes = (*blobs)->Remove(digest);
    if (bytes > 0) response.set_blobs_deleted(response.blobs_deleted() + 1);
    response.set_bytes_freed(response.bytes_freed() + bytes);
  }
  return response;
}

JobRetention::Collected JobRetention::CollectGarbage(std::chrono::seconds retention, std::chrono::seconds orphan_age) {
  Collected collected;
  std::vector<fs::path> folders;  // removed once the lock is released
  auto remove_folders = [&] {
    for (const fs::path& folder : folders) collected.bytes += RemoveFolder(folder);
  };
  std::unique_lock<std::mutex> lock(blob_lock_);
  // Old folders are listed before the jobs are read: a folder made after that (a job another replica
  // sharing the data folder stored meanwhile) is young, so it is never taken for a stray.
  const std::vector<fs::path> old_folders = OldFolders(fs::file_time_type::clock::now() - orphan_age);
  absl::StatusOr<std::vector<v1::Job>> all = services_.store->All();
  if (!all.ok()) {
    // Without the list of jobs, every blob and folder would look unused: nothing is collected.
    Log(LogLevel::kError, absl::StrCat("garbage collection skipped: ", all.status().ToString()));
    return collected;
  }
  if (retention.count() > 0) {
    DeleteExpired(*all, retention, collected, folders);
    all = services_.store->All();
    if (!all.ok()) {
      Log(LogLevel::kError, absl::StrCat("garbage collection stopped after retention: ", all.status().ToString()));
      lock.unlock();
      remove_folders();
      return collected;
    }
  }
  RemoveOrphanBlobs(*all, orphan_age, collected);
  // Old folders without a job: what a crash left.
  std::set<std::string> names;
  for (const v1::Job& job : *all) names.insert(std::string(absl::StripPrefix(job.name(), "jobs/")));
  for (const fs::path& folder : old_folders) {
    if (names.count(folder.filename().string()) > 0 || std::find(folders.begin(), folders.end(), folder) != folders.end()) {
      continue;
    }
    folders.push_back(folder);
    ++collected.folders;
  }
  lock.unlock();
  remove_folders();
  return collected;
}

std::vector<fs::path> JobRetention::OldFolders(fs::file_time_type cutoff) const {
  std::vector<fs::path> old_folders;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(services_.folders.Jobs(), error)) {
    std::error_code ignored;
    const auto written = fs::last_write_time(entry.path(), ignored);
    if (!ignored && written < cutoff) old_folders.push_back(entry.path());
  }
  return old_folders;
}

void JobRetention::DeleteExpired(const std::vector<v1::Job>& all, std::chrono::seconds retention, Collected& collected,
                                 std::vector<fs::path>& folders) {
  using google::protobuf::util::TimeUtil;
  // Which blobs the jobs use, counted once: each expired job's deletion takes its own share off.
  BlobUsage usage = CountBlobUsage(all);
  const int64_t cutoff = TimeUtil::TimestampToSeconds(TimestampNow()) - retention.count();
  for (const v1::Job& job : all) {
    if (!IsTerminal(job.state()) || !job.has_end_time() || TimeUtil::TimestampToSeconds(job.end_time()) > cutoff) {
      continue;
    }
    absl::StatusOr<v1::DeleteJobResponse> deleted = DeleteLocked(job, &usage);
    if (!deleted.ok()) {
      Log(LogLevel::kError, absl::StrCat("cannot delete expired ", job.name(), ": ", deleted.status().ToString()),
          {job.name(), job.tenant()});
      continue;
    }
    ++collected.jobs;
    folders.push_back(services_.folders.Job(job.name()));
    collected.blobs += deleted->blobs_deleted();
    collected.bytes += deleted->bytes_freed();
  }
}

void JobRetention::RemoveOrphanBlobs(const std::vector<v1::Job>& all, std::chrono::seconds orphan_age,
                                     Collected& collected) {
  std::map<std::string, std::set<std::string>> used;  // tenant -> digests
  for (const v1::Job& job : all) {
    for (const std::string& digest : BlobsOf(job)) used[job.tenant()].insert(digest);
  }
  services_.blobs->ForEach([&](const std::string& tenant, BlobStore& store) {
    for (const std::string& digest : store.BlobsOlderThan(orphan_age)) {
      if (used[tenant].count(digest) > 0) continue;
      const int64_t bytes = store.Remove(digest);
      collected.blobs += bytes > 0;
      collected.bytes += bytes;
    }
  });
}

}  // namespace onnxopt::server
