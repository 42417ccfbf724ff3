// The job store shared by server replicas: PostgreSQL (--job-store=postgresql://...). Nothing is
// cached: every read goes to the database, so what one replica stores the others see at once.
//   - Claiming takes the next queued job with FOR UPDATE SKIP LOCKED, so concurrent claimers never wait
//     for each other and never get the same job; leases are timed by the database's clock, so replicas'
//     clocks need not agree.
//   - WatchJob polls the job's version (at most kWatchPoll stale); cancelling a job that runs on another
//     replica reaches it with that replica's next lease renewal.
#ifndef ONNXOPT_SERVER_POSTGRES_JOB_STORE_H_
#define ONNXOPT_SERVER_POSTGRES_JOB_STORE_H_

#include "server/job_store.h"
#include "server/page_tokens.h"
#include "server/postgres.h"

namespace onnxopt::server {

class PostgresJobStore : public JobStore {
 public:
  static constexpr std::chrono::milliseconds kWatchPoll{200};
  // Connects (UNAVAILABLE when the database cannot be reached), applies missing migrations.
  static absl::StatusOr<std::unique_ptr<PostgresJobStore>> Open(const std::string& uri,
                                                                 const pg::PoolOptions& connections = {});

  absl::StatusOr<v1::Job> Create(v1::Job job, bool* created) override;
  absl::StatusOr<v1::Job> Get(const std::string& name) const override;
  std::optional<v1::Job> FindByRequestId(const std::string& tenant, const std::string& request_id) const override;
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
  std::string Describe() const override { return description_; }
  std::string kind() const override { return "postgresql"; }

 private:
  PostgresJobStore(std::unique_ptr<pg::Pool> pool, std::string uri, std::string page_key, std::string description);
  absl::StatusOr<pg::Pool::Lease> Connect() const { return pool_->Acquire(); }
  // Lease renewals and recovery have connections of their own, so that a crowd of watchers or API
  // calls never delays a renewal past its lease.
  absl::StatusOr<pg::Pool::Lease> ConnectForLeases() const { return lease_pool_->Acquire(); }
  // Writes `job` over row `sequence`, its columns derived from it; `lease` > 0 starts a lease.
  static absl::Status Write(pg::Connection& connection, int64_t sequence, const v1::Job& job,
                            std::chrono::seconds lease = std::chrono::seconds(0));
  // Runs a query that returns job rows (kJobColumns).
  absl::StatusOr<std::vector<v1::Job>> QueryJobs(const std::string& sql, const std::vector<pg::Param>& params) const;
  // The same for lookups whose callers cannot take a status: errors are logged and find nothing.
  std::optional<v1::Job> QueryFirstJob(const std::string& sql, const std::vector<pg::Param>& params) const;
  absl::StatusOr<int> QueryCount(const std::string& sql, const std::vector<pg::Param>& params) const;

  std::unique_ptr<pg::Pool> pool_;
  std::unique_ptr<pg::Pool> lease_pool_;
  const PageTokens page_tokens_;
  const std::string description_;
};

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_POSTGRES_JOB_STORE_H_
