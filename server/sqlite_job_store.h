// The embedded job store, for one machine: one SQLite row per job holding the serialized Job, mirrored
// in memory for reads. Every change bumps the job's version and wakes watchers, so WatchJob streams
// changes without polling the database. Jobs survive restarts: a job a killed server left RUNNING has
// no lease any more, so the next start's lease recovery queues it again.
#ifndef ONNXOPT_SERVER_SQLITE_JOB_STORE_H_
#define ONNXOPT_SERVER_SQLITE_JOB_STORE_H_

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "server/job_store.h"
#include "server/page_tokens.h"

struct sqlite3;

namespace onnxopt::server {

class SqliteJobStore : public JobStore {
 public:
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::filesystem::path& database);
  ~SqliteJobStore() override;

  absl::StatusOr<v1::Job> Create(v1::Job job, bool* created) override;
  absl::StatusOr<v1::Job> Get(const std::string& name) const override;
  std::optional<v1::Job> FindByRequestId(const std::string& tenant, const std::string& request_id) const override;
  // When the database refuses the write (a full disk), the change still holds (and is returned) and
  // is written with a later update; the refusal is logged. A job must not look RUNNING forever.
  absl::StatusOr<v1::Job> Modify(const std::string& name, const std::function<bool(v1::Job&)>& mutate,
                                 bool* applied) override;
  absl::StatusOr<Page> List(const JobFilter& filter, int page_size, const std::string& page_token,
                            const std::optional<std::string>& tenant = std::nullopt) const override;
  bool WaitForChange(const std::string& name, uint64_t* version, std::chrono::steady_clock::time_point deadline,
                     v1::Job* job) const override;
  absl::Status Delete(const std::string& name) override;
  absl::StatusOr<std::vector<v1::Job>> All() const override;
  std::optional<v1::Job> FindSucceeded(const std::string& tenant, const std::string& cache_key) const override;
  absl::StatusOr<int> CountActive(const std::string& tenant) const override;
  absl::StatusOr<int> QueueLength() const override;
  absl::StatusOr<std::optional<v1::Job>> Claim(const ClaimRequest& request) override;
  absl::StatusOr<LeaseState> RenewLease(const std::string& name, const std::string& token,
                                        std::chrono::seconds lease) override;
  absl::StatusOr<std::vector<v1::Job>> RecoverExpiredLeases(int max_attempts) override;
  std::string Describe() const override;
  std::string kind() const override { return "sqlite"; }

 private:
  struct Entry {
    v1::Job job;
    uint64_t version = 0;
    int64_t sequence = 0;
  };
  using QueueKey = std::tuple<int, int64_t>;  // (-priority, sequence)
  SqliteJobStore(sqlite3* db, std::filesystem::path path, std::string page_key);
  static std::string RequestKey(const std::string& tenant, const std::string& request_id);
  absl::Status Persist(const Entry& entry, bool insert);
  // Writes the jobs whose last update the database refused; mutex_ held.
  void PersistUnsaved();
  // Stores `updated` as the new state of `entry` (persisted, or kept unsaved), keeping the queue
  // index and leases in step; mutex_ held.
  void Replace(Entry& entry, Entry updated);

  sqlite3* db_;
  const std::filesystem::path path_;
  const PageTokens page_tokens_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::unordered_map<std::string, Entry> jobs_;
  std::map<int64_t, std::string> by_sequence_;
  std::unordered_map<std::string, std::string> by_request_id_;
  std::map<QueueKey, std::string> queued_;
  // Leases of RUNNING jobs; one without an entry (left by an earlier run) has expired.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> leases_;
  int64_t next_sequence_ = 1;
  std::set<std::string> unsaved_;  // updated in memory, not yet in the database
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_SQLITE_JOB_STORE_H_
