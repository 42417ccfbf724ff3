#include "server/sqlite_job_store.h"

#include <sqlite3.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "optimizer/failure.h"
#include "optimizer/utf8.h"
#include "server/log.h"

namespace onnxopt::server {
namespace {

std::string ColumnText(sqlite3_stmt* statement, int column) {
  const unsigned char* text = sqlite3_column_text(statement, column);
  return text == nullptr ? "" : ValidUtf8(reinterpret_cast<const char*>(text));
}

bool HasColumn(sqlite3* db, const std::string& table, const std::string& column) {
  sqlite3_stmt* statement = nullptr;
  bool found = false;
  if (sqlite3_prepare_v2(db, absl::StrCat("PRAGMA table_info(", table, ")").c_str(), -1, &statement, nullptr) == SQLITE_OK) {
    while (sqlite3_step(statement) == SQLITE_ROW) found |= ColumnText(statement, 1) == column;
  }
  sqlite3_finalize(statement);
  return found;
}

// The key page tokens are sealed with: made once, kept in the settings table.
absl::StatusOr<std::string> PageTokenKey(sqlite3* db) {
  sqlite3_stmt* statement = nullptr;
  std::string key;
  if (sqlite3_prepare_v2(db, "SELECT value FROM settings WHERE name = 'page_token_key'", -1, &statement, nullptr) ==
          SQLITE_OK &&
      sqlite3_step(statement) == SQLITE_ROW) {
    key.assign(static_cast<const char*>(sqlite3_column_blob(statement, 0)),
               static_cast<size_t>(sqlite3_column_bytes(statement, 0)));
  }
  sqlite3_finalize(statement);
  if (key.size() == 16) return key;
  absl::StatusOr<std::string> fresh = PageTokens::NewKey();
  if (!fresh.ok()) return fresh.status();
  sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO settings (name, value) VALUES ('page_token_key', ?1)", -1, &statement,
                     nullptr);
  sqlite3_bind_blob(statement, 1, fresh->data(), 16, SQLITE_TRANSIENT);
  const int result = sqlite3_step(statement);
  sqlite3_finalize(statement);
  if (result != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db)));
  return fresh;
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error ? error : "unknown";
    sqlite3_free(error);
    return absl::InternalError(absl::StrCat("sqlite: ", message));
  }
  return absl::OkStatus();
}

// The connection's settings, and the tables of schema 1 where the database has none yet.
absl::Status SetUpJobDatabase(sqlite3* db) {
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA busy_timeout=5000",
                          "CREATE TABLE IF NOT EXISTS jobs (sequence INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, "
                          "request_id TEXT, state INTEGER NOT NULL, job BLOB NOT NULL)",
                          "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value BLOB NOT NULL)"}) {
    if (absl::Status status = Exec(db, sql); !status.ok()) return status;
  }
  return absl::OkStatus();
}

// Schema 2 (tenants): the owner in a column of its own, so that a record that cannot be parsed
// still belongs to its tenant. Databases of earlier versions gain the column (their jobs: tenant "").
absl::Status AddTenantColumn(sqlite3* db) {
  if (HasColumn(db, "jobs", "tenant")) return absl::OkStatus();
  return Exec(db, "ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT ''");
}

}  // namespace

std::string SqliteJobStore::RequestKey(const std::string& tenant, const std::string& request_id) {
  return absl::StrCat(tenant, std::string(1, '\0'), request_id);
}

SqliteJobStore::SqliteJobStore(sqlite3* db, std::filesystem::path path, std::string page_key)
    : db_(db), path_(std::move(path)), page_tokens_(std::move(page_key)) {}
SqliteJobStore::~SqliteJobStore() { sqlite3_close(db_); }

std::string SqliteJobStore::Describe() const { return absl::StrCat("SQLite at ", path_.string()); }

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::filesystem::path& database) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(database.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("cannot open job database ", database.string(), ": ", message));
  }
  auto fail = [db](absl::Status status) {
    sqlite3_close(db);
    return status;
  };
  if (absl::Status status = SetUpJobDatabase(db); !status.ok()) return fail(status);
  absl::StatusOr<std::string> key = PageTokenKey(db);
  if (!key.ok()) return fail(key.status());
  if (absl::Status status = AddTenantColumn(db); !status.ok()) return fail(status);
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db, database, *std::move(key)));
  sqlite3_stmt* statement = nullptr;
  sqlite3_prepare_v2(db, "SELECT sequence, name, request_id, state, job, tenant FROM jobs ORDER BY sequence", -1,
                     &statement, nullptr);
  std::vector<Entry> unreadable;
  while (sqlite3_step(statement) == SQLITE_ROW) {
    Entry entry;
    entry.sequence = sqlite3_column_int64(statement, 0);
    // Every row counts for numbering, readable or not: a new job must never reuse a sequence.
    store->next_sequence_ = std::max(store->next_sequence_, entry.sequence + 1);
    const void* blob = sqlite3_column_blob(statement, 4);
    if (!entry.job.ParseFromArray(blob, sqlite3_column_bytes(statement, 4))) {
      entry.job = UnreadableJob(ColumnText(statement, 1), ColumnText(statement, 2),
                                static_cast<v1::JobState>(sqlite3_column_int(statement, 3)), ColumnText(statement, 5));
      unreadable.push_back(entry);
    }
    UpgradeRecord(entry.job);
    if (entry.job.name().empty() || store->jobs_.count(entry.job.name()) > 0) continue;
    const std::string name = entry.job.name();
    store->by_sequence_[entry.sequence] = name;
    if (!entry.job.request_id().empty()) store->by_request_id_[RequestKey(entry.job.tenant(), entry.job.request_id())] = name;
    if (entry.job.state() == v1::QUEUED) store->queued_[{-entry.job.config().priority(), entry.sequence}] = name;
    store->jobs_[name] = std::move(entry);
  }
  sqlite3_finalize(statement);
  // A job whose record cannot be read is kept, as what the columns still say, and written back so.
  for (const Entry& entry : unreadable) {
    absl::Status status = store->Persist(entry, /*insert=*/false);
    if (!status.ok()) return status;
  }
  return store;
}

absl::Status SqliteJobStore::Persist(const Entry& entry, bool insert) {
  const char* sql = insert ? "INSERT INTO jobs (sequence, name, request_id, state, job, tenant) "
                             "VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
                           : "UPDATE jobs SET state = ?4, job = ?5 WHERE sequence = ?1";
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &statement, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  const std::string bytes = entry.job.SerializeAsString();
  sqlite3_bind_int64(statement, 1, entry.sequence);
  if (insert) {
    sqlite3_bind_text(statement, 2, entry.job.name().c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(statement, 3, entry.job.request_id().c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(statement, 6, entry.job.tenant().c_str(), -1, SQLITE_TRANSIENT);
  }
  sqlite3_bind_int(statement, 4, entry.job.state());
  sqlite3_bind_blob(statement, 5, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  const int result = sqlite3_step(statement);
  sqlite3_finalize(statement);
  if (result == SQLITE_FULL) {
    return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::DISK_FULL,
                   absl::StrCat("the job database cannot grow: ", sqlite3_errmsg(db_)));
  }
  if (result != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> SqliteJobStore::Create(v1::Job job, bool* created) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!job.request_id().empty()) {
    auto it = by_request_id_.find(RequestKey(job.tenant(), job.request_id()));
    if (it != by_request_id_.end()) {
      *created = false;
      return jobs_.at(it->second).job;
    }
  }
  Entry entry;
  if (job.name().empty()) {
    do {
      job.set_name(NewJobName());
    } while (jobs_.count(job.name()) > 0);
  } else if (jobs_.count(job.name()) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("a job named ", job.name(), " exists already"));
  }
  if (!IsTerminal(job.state())) job.set_state(v1::QUEUED);
  MakeStringsValidUtf8(&job);  // proto3 strings: an invalid one makes the record unreadable
  entry.job = std::move(job);
  entry.sequence = next_sequence_++;
  absl::Status status = Persist(entry, /*insert=*/true);
  if (!status.ok()) return status;
  *created = true;
  const std::string name = entry.job.name();
  by_sequence_[entry.sequence] = name;
  if (!entry.job.request_id().empty()) by_request_id_[RequestKey(entry.job.tenant(), entry.job.request_id())] = name;
  if (entry.job.state() == v1::QUEUED) queued_[{-entry.job.config().priority(), entry.sequence}] = name;
  auto& stored = jobs_[name] = std::move(entry);
  changed_.notify_all();
  return stored.job;
}

absl::StatusOr<v1::Job> SqliteJobStore::Get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return JobNotFound(name);
  return it->second.job;
}

std::optional<v1::Job> SqliteJobStore::FindByRequestId(const std::string& tenant, const std::string& request_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_request_id_.find(RequestKey(tenant, request_id));
  if (it == by_request_id_.end()) return std::nullopt;
  return jobs_.at(it->second).job;
}

void SqliteJobStore::Replace(Entry& entry, Entry updated) {
  const std::string& name = updated.job.name();
  MakeStringsValidUtf8(&updated.job);  // errors and progress may quote a model's own text
  absl::Status status = Persist(updated, /*insert=*/false);
  ++updated.version;
  const QueueKey key{-entry.job.config().priority(), entry.sequence};
  if (entry.job.state() == v1::QUEUED) queued_.erase(key);
  if (updated.job.state() == v1::QUEUED) queued_[{-updated.job.config().priority(), updated.sequence}] = name;
  if (updated.job.state() != v1::RUNNING) leases_.erase(name);
  entry = std::move(updated);
  changed_.notify_all();
  if (!status.ok()) {
    unsaved_.insert(name);
    Log(LogLevel::kError, absl::StrCat(name, " changed in memory only for now: ", status.ToString()), {name});
  }
}

absl::StatusOr<v1::Job> SqliteJobStore::Modify(const std::string& name, const std::function<bool(v1::Job&)>& mutate,
                                               bool* applied) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return JobNotFound(name);
  PersistUnsaved();
  Entry updated = it->second;
  const bool changed = mutate(updated.job);
  if (applied != nullptr) *applied = changed;
  if (changed) Replace(it->second, std::move(updated));
  return it->second.job;
}

absl::StatusOr<JobStore::Page> SqliteJobStore::List(const JobFilter& filter, int page_size, const std::string& page_token,
                                                    const std::optional<std::string>& tenant) const {
  absl::StatusOr<int64_t> before = page_tokens_.Open(page_token, tenant);
  if (!before.ok()) return before.status();
  page_size = PageTokens::PageSize(page_size);
  Page page;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = by_sequence_.lower_bound(*before); it != by_sequence_.begin();) {
    --it;
    const Entry& entry = jobs_.at(it->second);
    if (!filter.Matches(entry.job)) continue;
    if (tenant && entry.job.tenant() != *tenant) continue;
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = page_tokens_.Seal(entry.sequence + 1, tenant);
      break;
    }
    page.jobs.push_back(entry.job);
  }
  return page;
}

bool SqliteJobStore::WaitForChange(const std::string& name, uint64_t* version,
                                   std::chrono::steady_clock::time_point deadline, v1::Job* job) const {
  std::unique_lock<std::mutex> lock(mutex_);
  auto newer = [&] {
    auto it = jobs_.find(name);
    return it == jobs_.end() || it->second.version > *version;
  };
  if (!changed_.wait_until(lock, deadline, newer)) return false;
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return false;
  *version = it->second.version;
  *job = it->second.job;
  return true;
}

void SqliteJobStore::PersistUnsaved() {
  for (auto it = unsaved_.begin(); it != unsaved_.end();) {
    auto entry = jobs_.find(*it);
    if (entry == jobs_.end() || Persist(entry->second, /*insert=*/false).ok()) {
      it = unsaved_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status SqliteJobStore::Delete(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return JobNotFound(name);
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v2(db_, "DELETE FROM jobs WHERE sequence = ?1", -1, &statement, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_int64(statement, 1, it->second.sequence);
  const int result = sqlite3_step(statement);
  sqlite3_finalize(statement);
  if (result != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  const v1::Job& job = it->second.job;
  unsaved_.erase(name);
  leases_.erase(name);
  if (job.state() == v1::QUEUED) queued_.erase({-job.config().priority(), it->second.sequence});
  if (!job.request_id().empty()) by_request_id_.erase(RequestKey(job.tenant(), job.request_id()));
  by_sequence_.erase(it->second.sequence);
  jobs_.erase(it);
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> SqliteJobStore::All() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<v1::Job> all;
  for (const auto& entry : by_sequence_) all.push_back(jobs_.at(entry.second).job);
  return all;
}

std::optional<v1::Job> SqliteJobStore::FindSucceeded(const std::string& tenant, const std::string& cache_key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = by_sequence_.rbegin(); it != by_sequence_.rend(); ++it) {
    const v1::Job& job = jobs_.at(it->second).job;
    if (job.state() == v1::SUCCEEDED && job.tenant() == tenant && job.cache_key() == cache_key) return job;
  }
  return std::nullopt;
}

absl::StatusOr<int> SqliteJobStore::CountActive(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int active = 0;
  for (const auto& [name, entry] : jobs_) active += entry.job.tenant() == tenant && !IsTerminal(entry.job.state());
  return active;
}

absl::StatusOr<int> SqliteJobStore::QueueLength() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(queued_.size());
}

absl::StatusOr<std::optional<v1::Job>> SqliteJobStore::Claim(const ClaimRequest& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  PersistUnsaved();
  for (const auto& [key, name] : queued_) {
    Entry& entry = jobs_.at(name);
    if (!MayClaim(request.device, entry.job)) continue;
    Entry updated = entry;
    MarkClaimed(updated.job, request.owner);
    const std::string claimed = name;  // Replace erases the queue entry `name` refers to
    Replace(entry, std::move(updated));
    leases_[claimed] = std::chrono::steady_clock::now() + request.lease;
    return std::optional<v1::Job>(entry.job);
  }
  return std::optional<v1::Job>();
}

absl::StatusOr<LeaseState> SqliteJobStore::RenewLease(const std::string& name, const std::string& token,
                                                      std::chrono::seconds lease) {
  std::lock_guard<std::mutex> lock(mutex_);
  LeaseState state;
  auto it = jobs_.find(name);
  auto held = leases_.find(name);
  if (it == jobs_.end() || held == leases_.end() || it->second.job.state() != v1::RUNNING ||
      LeaseToken(it->second.job) != token) {
    return state;
  }
  held->second = std::chrono::steady_clock::now() + lease;
  state.held = true;
  state.cancel_requested = it->second.job.cancel_requested();
  return state;
}

absl::StatusOr<std::vector<v1::Job>> SqliteJobStore::RecoverExpiredLeases(int max_attempts) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  std::vector<v1::Job> recovered;
  for (auto& [name, entry] : jobs_) {
    if (entry.job.state() != v1::RUNNING) continue;
    auto lease = leases_.find(name);
    if (lease != leases_.end() && lease->second > now) continue;
    Entry updated = entry;
    ExpireLease(updated.job, max_attempts);
    Replace(entry, std::move(updated));
    recovered.push_back(entry.job);
  }
  return recovered;
}

}  // namespace onnxopt::server
