#include "server/postgres_job_store.h"

#include <iostream>
#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "optimizer/utf8.h"
#include "server/postgres_schema.h"
#include "server/log.h"

namespace onnxopt::server {
namespace {

// Rows read per query while a label filter looks for a page of matches.
constexpr int kLabelScanBatch = 500;

// The columns every job query selects, in this order (see ReadRow).
constexpr char kJobColumns[] = "sequence, job, request_id, state, tenant, version, name";
// The job of a request id ($1 tenant, $2 request id).
std::string ByRequestId() {
  return absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE tenant = $1 AND request_id = $2");
}

struct Row {
  int64_t sequence = 0;
  uint64_t version = 0;
  v1::Job job;
};

Row ReadRow(const pg::Result& result, int row) {
  Row read;
  read.sequence = result.Int(row, 0);
  read.version = static_cast<uint64_t>(result.Int(row, 5));
  if (!read.job.ParseFromString(result.Bytes(row, 1))) {
    read.job = UnreadableJob(ValidUtf8(result.Text(row, 6)), ValidUtf8(result.Text(row, 2)),
                             static_cast<v1::JobState>(result.Int(row, 3)), ValidUtf8(result.Text(row, 4)));
  }
  UpgradeRecord(read.job);
  return read;
}

void LogError(const char* what, const absl::Status& status) {
  Log(LogLevel::kError, absl::StrCat("job store (", what, "): ", status.ToString()));
}

}  // namespace

PostgresJobStore::PostgresJobStore(std::unique_ptr<pg::Pool> pool, std::string uri, std::string page_key,
                                   std::string description)
    : pool_(std::move(pool)),
      lease_pool_(std::make_unique<pg::Pool>(std::move(uri), pg::PoolOptions{2, pool_->options().max_age})),
      page_tokens_(std::move(page_key)),
      description_(std::move(description)) {}

absl::StatusOr<std::unique_ptr<PostgresJobStore>> PostgresJobStore::Open(const std::string& uri,
                                                                         const pg::PoolOptions& connections) {
  pg::PoolOptions requests = connections;
  requests.max_connections = std::max(2, connections.max_connections);
  auto pool = std::make_unique<pg::Pool>(uri, requests);
  std::string key, description;
  {
    absl::StatusOr<pg::Pool::Lease> connection = pool->Acquire();
    if (!connection.ok()) return connection.status();
    description = absl::StrCat("PostgreSQL ", (*connection)->Describe());
    if (absl::Status migrated = MigratePostgres(**connection); !migrated.ok()) return migrated;
    // The key page tokens are sealed with: the first replica's, for all of them.
    absl::StatusOr<std::string> fresh = PageTokens::NewKey();
    if (!fresh.ok()) return fresh.status();
    auto stored = (*connection)->Exec(
        "INSERT INTO onnxopt_settings (name, value) VALUES ('page_token_key', $1) ON CONFLICT (name) DO NOTHING",
        {pg::Param::Bytes(*fresh)});
    if (!stored.ok()) return stored.status();
    auto read = (*connection)->Exec("SELECT value FROM onnxopt_settings WHERE name = 'page_token_key'");
    if (!read.ok()) return read.status();
    key = read->rows() == 1 ? read->Bytes(0, 0) : "";
    if (key.size() != 16) return absl::DataLossError("the job store's page token key is damaged");
  }
  return std::unique_ptr<PostgresJobStore>(new PostgresJobStore(std::move(pool), uri, std::move(key), description));
}

absl::Status PostgresJobStore::Write(pg::Connection& connection, int64_t sequence, const v1::Job& job,
                                     std::chrono::seconds lease) {
  const bool running = job.state() == v1::RUNNING;
  auto written = connection.Exec(
      "UPDATE onnxopt_jobs SET job = $2, state = $3, priority = $4, wants_cuda = $5, cache_key = $6, "
      "cancel_requested = $7, version = version + 1, lease_owner = $8, "
      "lease_expires = CASE WHEN NOT $9::boolean THEN NULL "
      "                     WHEN $10::integer > 0 THEN now() + make_interval(secs => $10::integer) "
      "                     ELSE lease_expires END "
      "WHERE sequence = $1",
      {sequence, pg::Param::Bytes(job.SerializeAsString()), static_cast<int>(job.state()), job.config().priority(),
       WantsCuda(job), job.cache_key(), job.cancel_requested(), running ? pg::Param(LeaseToken(job)) : pg::Param::Null(),
       running, static_cast<int64_t>(lease.count())});
  return written.status();
}

absl::StatusOr<v1::Job> PostgresJobStore::Create(v1::Job job, bool* created) {
  if (!IsTerminal(job.state())) job.set_state(v1::QUEUED);
  MakeStringsValidUtf8(&job);
  const bool named = !job.name().empty();
  for (int tries = 0;; ++tries) {
    if (!named) job.set_name(NewJobName());
    // A connection per statement: the lookup below must not wait for a second one while holding this.
    absl::StatusOr<pg::Pool::Lease> connection = Connect();
    if (!connection.ok()) return connection.status();
    auto inserted = (*connection)->Exec(
        "INSERT INTO onnxopt_jobs (name, tenant, request_id, state, priority, wants_cuda, cache_key, job) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
        "ON CONFLICT (tenant, request_id) WHERE request_id <> '' DO NOTHING RETURNING sequence",
        {job.name(), job.tenant(), job.request_id(), static_cast<int>(job.state()), job.config().priority(),
         WantsCuda(job), job.cache_key(), pg::Param::Bytes(job.SerializeAsString())});
    // A name another job drew in the same millisecond: draw again.
    if (!inserted.ok() && inserted.status().code() == absl::StatusCode::kFailedPrecondition && !named && tries < 5) {
      continue;
    }
    if (!inserted.ok() && named && inserted.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::AlreadyExistsError(absl::StrCat("a job named ", job.name(), " exists already"));
    }
    if (!inserted.ok()) return inserted.status();
    if (inserted->rows() == 1) {
      *created = true;
      return job;
    }
    break;
  }
  // The request id was taken, maybe by another replica a moment ago: that job is the answer.
  absl::StatusOr<std::vector<v1::Job>> existing = QueryJobs(ByRequestId(), {job.tenant(), job.request_id()});
  if (!existing.ok()) return existing.status();
  if (existing->empty()) return absl::AbortedError("the job of this request id was deleted meanwhile; retry");
  *created = false;
  return existing->front();
}

absl::StatusOr<v1::Job> PostgresJobStore::Get(const std::string& name) const {
  absl::StatusOr<pg::Pool::Lease> connection = Connect();
  if (!connection.ok()) return connection.status();
  auto read = (*connection)->Exec(absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE name = $1"), {name});
  if (!read.ok()) return read.status();
  if (read->rows() == 0) return JobNotFound(name);
  return ReadRow(*read, 0).job;
}

absl::StatusOr<std::vector<v1::Job>> PostgresJobStore::QueryJobs(const std::string& sql,
                                                                 const std::vector<pg::Param>& params) const {
  absl::StatusOr<pg::Pool::Lease> connection = Connect();
  if (!connection.ok()) return connection.status();
  absl::StatusOr<pg::Result> read = (*connection)->Exec(sql, params);
  if (!read.ok()) return read.status();
  std::vector<v1::Job> jobs;
  for (int row = 0; row < read->rows(); ++row) jobs.push_back(ReadRow(*read, row).job);
  return jobs;
}

std::optional<v1::Job> PostgresJobStore::QueryFirstJob(const std::string& sql,
                                                       const std::vector<pg::Param>& params) const {
  absl::StatusOr<std::vector<v1::Job>> jobs = QueryJobs(sql, params);
  if (!jobs.ok()) {
    LogError("lookup", jobs.status());
    return std::nullopt;
  }
  if (jobs->empty()) return std::nullopt;
  return jobs->front();
}

absl::StatusOr<int> PostgresJobStore::QueryCount(const std::string& sql, const std::vector<pg::Param>& params) const {
  absl::StatusOr<pg::Pool::Lease> connection = Connect();
  if (!connection.ok()) return connection.status();
  absl::StatusOr<pg::Result> read = (*connection)->Exec(sql, params);
  if (!read.ok()) return read.status();
  return static_cast<int>(read->Int(0, 0));
}

std::optional<v1::Job> PostgresJobStore::FindByRequestId(const std::string& tenant, const std::string& request_id) const {
  if (request_id.empty()) return std::nullopt;
  return QueryFirstJob(ByRequestId(), {tenant, request_id});
}

absl::StatusOr<v1::Job> PostgresJobStore::Modify(const std::string& name, const std::function<bool(v1::Job&)>& mutate,
                                                 bool* applied) {
  absl::StatusOr<pg::Pool::Lease> connection = Connect();
  if (!connection.ok()) return connection.status();
  v1::Job job;
  bool changed = false;
  absl::Status status = (*connection)->Transaction([&]() -> absl::Status {
    auto read = (*connection)->Exec(
        absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE name = $1 FOR UPDATE"), {name});
    if (!read.ok()) return read.status();
    if (read->rows() == 0) return JobNotFound(name);
    Row row = ReadRow(*read, 0);
    job = std::move(row.job);
    changed = mutate(job);
    if (!changed) return absl::OkStatus();
    MakeStringsValidUtf8(&job);  // errors and progress may quote a model's own text
    return Write(**connection, row.sequence, job);
  });
  if (!status.ok()) return status;
  if (applied != nullptr) *applied = changed;
  return job;
}

absl::StatusOr<JobStore::Page> PostgresJobStore::List(const JobFilter& filter, int page_size,
                                                      const std::string& page_token,
                                                      const std::optional<std::string>& tenant) const {
  absl::StatusOr<int64_t> before = page_tokens_.Open(page_token, tenant);
  if (!before.ok()) return before.status();
  page_size = PageTokens::PageSize(page_size);
  absl::StatusOr<pg::Pool::Lease> connection = Connect();
  if (!connection.ok()) return connection.status();
  // State and tenant are columns; labels live in the stored job, so rows are read in batches (larger
  // than a page when labels filter: a selective filter must not cost a query per row) and matched here
  // until the page is full or no row is left.
  const int batch = filter.labels.empty() ? page_size + 1 : std::max(page_size + 1, kLabelScanBatch);
  Page page;
  int64_t cursor = *before;
  while (true) {
    auto read = (*connection)->Exec(
        absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE sequence < $1 AND ($2 = 0 OR state = $2) "
                     "AND ($3::text IS NULL OR tenant = $3) ORDER BY sequence DESC LIMIT $4"),
        {cursor, static_cast<int>(filter.state), tenant ? pg::Param(*tenant) : pg::Param::Null(), batch});
    if (!read.ok()) return read.status();
    for (int row = 0; row < read->rows(); ++row) {
      Row job = ReadRow(*read, row);
      cursor = job.sequence;
      if (!filter.Matches(job.job)) continue;
      if (static_cast<int>(page.jobs.size()) == page_size) {
        page.next_page_token = page_tokens_.Seal(job.sequence + 1, tenant);
        return page;
      }
      page.jobs.push_back(std::move(job.job));
    }
    if (read->rows() < batch) return page;  // the last batch
  }
}

bool PostgresJobStore::WaitForChange(const std::string& name, uint64_t* version,
                                     std::chrono::steady_clock::time_point deadline, v1::Job* job) const {
  while (true) {
    {
      absl::StatusOr<pg::Pool::Lease> connection = Connect();
      absl::StatusOr<pg::Result> read =
          connection.ok() ? (*connection)->Exec(
                                absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE name = $1"), {name})
                          : connection.status();
      if (read.ok() && read->rows() == 0) return false;  // gone: the caller's Get says so
      if (read.ok()) {
        Row row = ReadRow(*read, 0);
        if (row.version > *version) {
          *version = row.version;
          *job = std::move(row.job);
          return true;
        }
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(kWatchPoll, deadline - now));
  }
}

absl::Status PostgresJobStore::Delete(const std::string& name) {
  absl::StatusOr<pg::Pool::Lease> connection = Connect();
  if (!connection.ok()) return connection.status();
  auto deleted = (*connection)->Exec("DELETE FROM onnxopt_jobs WHERE name = $1", {name});
  if (!deleted.ok()) return deleted.status();
  if (deleted->affected() == 0) return JobNotFound(name);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> PostgresJobStore::All() const {
  return QueryJobs(absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs ORDER BY sequence"), {});
}

std::optional<v1::Job> PostgresJobStore::FindSucceeded(const std::string& tenant, const std::string& cache_key) const {
  return QueryFirstJob(
      absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE tenant = $1 AND cache_key = $2 AND state = $3 "
                   "ORDER BY sequence DESC LIMIT 1"),
      {tenant, cache_key, static_cast<int>(v1::SUCCEEDED)});
}

absl::StatusOr<int> PostgresJobStore::CountActive(const std::string& tenant) const {
  return QueryCount("SELECT count(*) FROM onnxopt_jobs WHERE tenant = $1 AND state IN ($2, $3)",
                    {tenant, static_cast<int>(v1::QUEUED), static_cast<int>(v1::RUNNING)});
}

absl::StatusOr<int> PostgresJobStore::QueueLength() const {
  return QueryCount("SELECT count(*) FROM onnxopt_jobs WHERE state = $1", {static_cast<int>(v1::QUEUED)});
}

absl::StatusOr<std::optional<v1::Job>> PostgresJobStore::Claim(const ClaimRequest& request) {
  absl::StatusOr<pg::Pool::Lease> connection = Connect();
  if (!connection.ok()) return connection.status();
  const char* device = request.device == WorkerDevice::kCuda  ? " AND wants_cuda"
                       : request.device == WorkerDevice::kCpu ? " AND NOT wants_cuda"
                                                              : "";
  std::optional<v1::Job> claimed;
  absl::Status status = (*connection)->Transaction([&]() -> absl::Status {
    // Rows other claimers hold are skipped, not waited for: each claimer gets a job of its own.
    auto read = (*connection)->Exec(
        absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE state = $1", device,
                     " ORDER BY priority DESC, sequence LIMIT 1 FOR UPDATE SKIP LOCKED"),
        {static_cast<int>(v1::QUEUED)});
    if (!read.ok()) return read.status();
    if (read->rows() == 0) return absl::OkStatus();
    Row row = ReadRow(*read, 0);
    if (row.job.state() != v1::QUEUED) {
      // A record that does not parse (UnreadableJob made it FAILED): stored so, and not run.
      return Write(**connection, row.sequence, row.job);
    }
    MarkClaimed(row.job, request.owner);
    absl::Status written = Write(**connection, row.sequence, row.job, request.lease);
    if (written.ok()) claimed = std::move(row.job);
    return written;
  });
  if (!status.ok()) return status;
  return claimed;
}

absl::StatusOr<LeaseState> PostgresJobStore::RenewLease(const std::string& name, const std::string& token,
                                                        std::chrono::seconds lease) {
  absl::StatusOr<pg::Pool::Lease> connection = ConnectForLeases();
  if (!connection.ok()) return connection.status();
  auto renewed = (*connection)->Exec(
      "UPDATE onnxopt_jobs SET lease_expires = now() + make_interval(secs => $3::integer) "
      "WHERE name = $1 AND state = $4 AND lease_owner = $2 RETURNING cancel_requested",
      {name, token, static_cast<int64_t>(lease.count()), static_cast<int>(v1::RUNNING)});
  if (!renewed.ok()) return renewed.status();
  LeaseState state;
  state.held = renewed->rows() == 1;
  state.cancel_requested = state.held && renewed->Bool(0, 0);
  return state;
}

absl::StatusOr<std::vector<v1::Job>> PostgresJobStore::RecoverExpiredLeases(int max_attempts) {
  absl::StatusOr<pg::Pool::Lease> connection = ConnectForLeases();
  if (!connection.ok()) return connection.status();
  std::vector<v1::Job> recovered;
  absl::Status status = (*connection)->Transaction([&]() -> absl::Status {
    auto read = (*connection)->Exec(
        absl::StrCat("SELECT ", kJobColumns, " FROM onnxopt_jobs WHERE state = $1 AND "
                     "(lease_expires IS NULL OR lease_expires < now()) ORDER BY sequence LIMIT 100 "
                     "FOR UPDATE SKIP LOCKED"),
        {static_cast<int>(v1::RUNNING)});
    if (!read.ok()) return read.status();
    for (int i = 0; i < read->rows(); ++i) {
      Row row = ReadRow(*read, i);
      if (row.job.state() == v1::RUNNING) ExpireLease(row.job, max_attempts);
      if (absl::Status written = Write(**connection, row.sequence, row.job); !written.ok()) return written;
      recovered.push_back(std::move(row.job));
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return recovered;
}

}  // namespace onnxopt::server
