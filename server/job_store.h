// Jobs, persisted in SQLite (one row per job holding the serialized Job) and mirrored in memory for
// reads. Every change bumps the job's version and wakes watchers, so WatchJob streams changes without
// polling the database. Jobs survive restarts; the server re-queues unfinished ones at start.
#ifndef ONNXOPT_SERVER_JOB_STORE_H_
#define ONNXOPT_SERVER_JOB_STORE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnxopt/v1/service.pb.h"

struct sqlite3;

namespace onnxopt::server {

bool IsTerminal(v1::JobState state);
// NOT_FOUND (JOB_NOT_FOUND) for `name`: what every lookup of a job the caller cannot have says.
absl::Status JobNotFound(const std::string& name);

class JobStore {
 public:
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::filesystem::path& database);
  ~JobStore();

  // Stores a new job (its name is assigned here). With a request id seen before, returns that job and
  // sets *created to false instead.
  absl::StatusOr<v1::Job> Create(v1::Job job, bool* created);
  absl::StatusOr<v1::Job> Get(const std::string& name) const;
  // Request ids are per tenant: another tenant's id neither finds nor blocks anything.
  std::optional<v1::Job> FindByRequestId(const std::string& tenant, const std::string& request_id) const;
  // Applies `mutate` to the job, persists it and wakes watchers. NOT_FOUND for unknown jobs. When the
  // database refuses the write (a full disk), the change still holds (and is returned) and is written
  // with a later update; the refusal is logged.
  absl::StatusOr<v1::Job> Update(const std::string& name, const std::function<void(v1::Job&)>& mutate);

  struct Page {
    std::vector<v1::Job> jobs;
    std::string next_page_token;
  };
  // Newest first; only `tenant`'s jobs when it is set. INVALID_ARGUMENT for a malformed page token.
  absl::StatusOr<Page> List(v1::JobState state, int page_size, const std::string& page_token,
                            const std::optional<std::string>& tenant = std::nullopt) const;

  // Waits until the job's version passes `*version` or `deadline` passes; then fills `job` and
  // `*version`. Returns false on timeout with nothing changed.
  bool WaitForChange(const std::string& name, uint64_t* version, std::chrono::steady_clock::time_point deadline,
                     v1::Job* job) const;

  // Removes a job's record (NOT_FOUND for unknown jobs); watchers of it see it gone.
  absl::Status Delete(const std::string& name);
  // Every job, oldest first (for retention and blob garbage collection).
  std::vector<v1::Job> All() const;
  // The latest SUCCEEDED job of `tenant` with this cache key (see Job.cache_key).
  std::optional<v1::Job> FindSucceeded(const std::string& tenant, const std::string& cache_key) const;
  // `tenant`'s jobs that are QUEUED or RUNNING.
  int CountActive(const std::string& tenant) const;
  // Jobs left QUEUED or RUNNING by an earlier run, oldest first.
  std::vector<v1::Job> Unfinished() const;
  size_t size() const;

 private:
  struct Entry {
    v1::Job job;
    uint64_t version = 0;
    int64_t sequence = 0;
  };
  explicit JobStore(sqlite3* db);
  static std::string RequestKey(const std::string& tenant, const std::string& request_id);
  absl::Status Persist(const Entry& entry, bool insert);
  // Writes the jobs whose last update the database refused; mutex_ held.
  void PersistUnsaved();

  sqlite3* db_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::unordered_map<std::string, Entry> jobs_;
  std::map<int64_t, std::string> by_sequence_;
  std::unordered_map<std::string, std::string> by_request_id_;
  int64_t next_sequence_ = 1;
  std::set<std::string> unsaved_;  // updated in memory, not yet in the database
  std::string page_key_;           // seals ListJobs page tokens
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_STORE_H_
