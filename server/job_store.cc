#include "server/job_store.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sqlite3.h>

#include <cstring>
#include <iostream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "optimizer/sha256.h"
#include "optimizer/utf8.h"

namespace onnxopt::server {
namespace {

std::string NewJobId() {
  static std::mt19937_64 random{std::random_device{}()};
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  return absl::StrFormat("jobs/%011x%06x", millis, random() & 0xffffff);
}

std::string ColumnText(sqlite3_stmt* statement, int column) {
  const unsigned char* text = sqlite3_column_text(statement, column);
  return text == nullptr ? "" : ValidUtf8(reinterpret_cast<const char*>(text));
}

// What is left of a job whose stored record does not parse (written by an older version, or damaged).
// One that had not finished cannot be run again without its request, so it is failed, saying why.
v1::Job UnreadableJob(const std::string& name, const std::string& request_id, v1::JobState state,
                      const std::string& tenant) {
  v1::Job job;
  job.set_name(name);
  job.set_tenant(tenant);  // from its own column: the job stays its owner's
  job.set_request_id(request_id);
  job.set_state(IsTerminal(state) ? state : v1::FAILED);
  if (state != v1::SUCCEEDED) {
    v1::JobError* error = job.mutable_error();
    error->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
    error->set_reason("JOB_RECORD_UNREADABLE");
    error->set_message(absl::StrCat("the job store could not read this job's record (it was ",
                                    v1::JobState_Name(state), "); submit the model again"));
  }
  return job;
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

// 16 random bytes stored in the settings table, made on first use.
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
  key.resize(16);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), 16) != 1) {
    return absl::InternalError("cannot draw a random page token key");
  }
  sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO settings (name, value) VALUES ('page_token_key', ?1)", -1, &statement,
                     nullptr);
  sqlite3_bind_blob(statement, 1, key.data(), 16, SQLITE_TRANSIENT);
  const int result = sqlite3_step(statement);
  sqlite3_finalize(statement);
  if (result != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db)));
  return key;
}

// One AES-128 block, in either direction (a 16-byte token is one block: ECB is a plain permutation).
std::optional<std::string> AesBlock(const std::string& key, const std::string& block, bool encrypt) {
  EVP_CIPHER_CTX* context = EVP_CIPHER_CTX_new();
  std::string out(32, '\0');
  int length = 0, final_length = 0;
  const bool ok = context != nullptr &&
                  EVP_CipherInit_ex(context, EVP_aes_128_ecb(), nullptr,
                                    reinterpret_cast<const unsigned char*>(key.data()), nullptr, encrypt ? 1 : 0) == 1 &&
                  EVP_CIPHER_CTX_set_padding(context, 0) == 1 &&
                  EVP_CipherUpdate(context, reinterpret_cast<unsigned char*>(out.data()), &length,
                                   reinterpret_cast<const unsigned char*>(block.data()), 16) == 1 &&
                  EVP_CipherFinal_ex(context, reinterpret_cast<unsigned char*>(out.data()) + length, &final_length) == 1;
  EVP_CIPHER_CTX_free(context);
  if (!ok || length + final_length != 16) return std::nullopt;
  out.resize(16);
  return out;
}

// What a page token seals: where the next page starts and whose listing it belongs to.
std::string PageScope(const std::optional<std::string>& tenant) {
  return Sha256OfBytes(tenant ? "tenant:" + *tenant : std::string("all")).substr(0, 16);
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

}  // namespace

std::string JobStore::RequestKey(const std::string& tenant, const std::string& request_id) {
  return absl::StrCat(tenant, std::string(1, '\0'), request_id);
}

absl::Status JobNotFound(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("JOB_NOT_FOUND: no job named '", name, "'"));
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

JobStore::JobStore(sqlite3* db) : db_(db) {}
JobStore::~JobStore() { sqlite3_close(db_); }

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::filesystem::path& database) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(database.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("cannot open job database ", database.string(), ": ", message));
  }
  std::unique_ptr<JobStore> store(new JobStore(db));
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA busy_timeout=5000",
                          "CREATE TABLE IF NOT EXISTS jobs (sequence INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, "
                          "request_id TEXT, state INTEGER NOT NULL, job BLOB NOT NULL)"}) {
    absl::Status status = Exec(db, sql);
    if (!status.ok()) return status;
  }
  // The key page tokens are sealed with (made once, kept with the jobs so tokens outlive restarts).
  if (absl::Status status = Exec(db, "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value BLOB NOT NULL)");
      !status.ok()) {
    return status;
  }
  absl::StatusOr<std::string> key = PageTokenKey(db);
  if (!key.ok()) return key.status();
  store->page_key_ = *std::move(key);
  // Schema 2 (tenants): the owner in a column of its own, so that a record that cannot be parsed
  // still belongs to its tenant. Databases of earlier versions gain the column (their jobs: tenant "").
  if (!HasColumn(db, "jobs", "tenant")) {
    absl::Status status = Exec(db, "ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT ''");
    if (!status.ok()) return status;
  }
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
    if (entry.job.name().empty() || store->jobs_.count(entry.job.name()) > 0) continue;
    store->by_sequence_[entry.sequence] = entry.job.name();
    if (!entry.job.request_id().empty()) store->by_request_id_[RequestKey(entry.job.tenant(), entry.job.request_id())] = entry.job.name();
    store->jobs_[entry.job.name()] = std::move(entry);
  }
  sqlite3_finalize(statement);
  // A job whose record cannot be read is kept, as what the columns still say, and written back so.
  for (const Entry& entry : unreadable) {
    absl::Status status = store->Persist(entry, /*insert=*/false);
    if (!status.ok()) return status;
  }
  return store;
}

absl::Status JobStore::Persist(const Entry& entry, bool insert) {
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
    return absl::ResourceExhaustedError(absl::StrCat("DISK_FULL: the job database cannot grow: ", sqlite3_errmsg(db_)));
  }
  if (result != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobStore::Create(v1::Job job, bool* created) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!job.request_id().empty()) {
    auto it = by_request_id_.find(RequestKey(job.tenant(), job.request_id()));
    if (it != by_request_id_.end()) {
      *created = false;
      return jobs_.at(it->second).job;
    }
  }
  Entry entry;
  do {
    job.set_name(NewJobId());
  } while (jobs_.count(job.name()) > 0);
  MakeStringsValidUtf8(&job);  // proto3 strings: an invalid one makes the record unreadable
  entry.job = std::move(job);
  entry.sequence = next_sequence_++;
  absl::Status status = Persist(entry, /*insert=*/true);
  if (!status.ok()) return status;
  *created = true;
  const std::string name = entry.job.name();
  by_sequence_[entry.sequence] = name;
  if (!entry.job.request_id().empty()) by_request_id_[RequestKey(entry.job.tenant(), entry.job.request_id())] = name;
  auto& stored = jobs_[name] = std::move(entry);
  changed_.notify_all();
  return stored.job;
}

absl::StatusOr<v1::Job> JobStore::Get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return JobNotFound(name);
  return it->second.job;
}

std::optional<v1::Job> JobStore::FindByRequestId(const std::string& tenant, const std::string& request_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_request_id_.find(RequestKey(tenant, request_id));
  if (it == by_request_id_.end()) return std::nullopt;
  return jobs_.at(it->second).job;
}

absl::StatusOr<v1::Job> JobStore::Update(const std::string& name, const std::function<void(v1::Job&)>& mutate) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return JobNotFound(name);
  PersistUnsaved();
  Entry updated = it->second;
  mutate(updated.job);
  MakeStringsValidUtf8(&updated.job);  // errors and progress may quote a model's own text
  absl::Status status = Persist(updated, /*insert=*/false);
  // Readers and watchers see the change even when the database cannot take it (a full disk): a job
  // must not look RUNNING forever. It is written again with the next update that can be.
  ++updated.version;
  it->second = std::move(updated);
  changed_.notify_all();
  if (!status.ok()) {
    unsaved_.insert(name);
    std::cerr << "onnxopt-server: " << name << " changed in memory only for now: " << status << std::endl;
  }
  return it->second.job;
}

absl::StatusOr<JobStore::Page> JobStore::List(v1::JobState state, int page_size, const std::string& page_token,
                                              const std::optional<std::string>& tenant) const {
  // Tokens are sealed: a tenant's token tells nothing of how many jobs others made in between.
  int64_t before = INT64_MAX;
  if (!page_token.empty()) {
    std::string sealed;
    std::optional<std::string> block;
    if (page_token.size() == 32 && absl::ascii_isxdigit(page_token[0])) sealed = absl::HexStringToBytes(page_token);
    if (sealed.size() == 16) block = AesBlock(page_key_, sealed, /*encrypt=*/false);
    const std::string scope = PageScope(tenant);
    if (!block || absl::BytesToHexString(block->substr(8)) != scope ||
        (std::memcpy(&before, block->data(), 8), before <= 0)) {
      return absl::InvalidArgumentError("BAD_PAGE_TOKEN: page_token is not one this server handed out for this listing");
    }
  }
  if (page_size <= 0) page_size = 50;
  page_size = std::min(page_size, 500);
  Page page;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = by_sequence_.lower_bound(before); it != by_sequence_.begin();) {
    --it;
    const Entry& entry = jobs_.at(it->second);
    if (state != v1::JOB_STATE_UNSPECIFIED && entry.job.state() != state) continue;
    if (tenant && entry.job.tenant() != *tenant) continue;
    if (static_cast<int>(page.jobs.size()) == page_size) {
      const int64_t next = entry.sequence + 1;
      std::string block(reinterpret_cast<const char*>(&next), 8);
      block += absl::HexStringToBytes(PageScope(tenant));
      std::optional<std::string> sealed = AesBlock(page_key_, block, /*encrypt=*/true);
      if (sealed) page.next_page_token = absl::BytesToHexString(*sealed);
      break;
    }
    page.jobs.push_back(entry.job);
  }
  return page;
}

bool JobStore::WaitForChange(const std::string& name, uint64_t* version, std::chrono::steady_clock::time_point deadline,
                             v1::Job* job) const {
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

std::vector<v1::Job> JobStore::Unfinished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<v1::Job> unfinished;
  for (const auto& entry : by_sequence_) {
    const v1::Job& job = jobs_.at(entry.second).job;
    if (!IsTerminal(job.state())) unfinished.push_back(job);
  }
  return unfinished;
}

void JobStore::PersistUnsaved() {
  for (auto it = unsaved_.begin(); it != unsaved_.end();) {
    auto entry = jobs_.find(*it);
    if (entry == jobs_.end() || Persist(entry->second, /*insert=*/false).ok()) {
      it = unsaved_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status JobStore::Delete(const std::string& name) {
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
  if (!job.request_id().empty()) by_request_id_.erase(RequestKey(job.tenant(), job.request_id()));
  by_sequence_.erase(it->second.sequence);
  jobs_.erase(it);
  changed_.notify_all();
  return absl::OkStatus();
}

std::vector<v1::Job> JobStore::All() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<v1::Job> all;
  for (const auto& entry : by_sequence_) all.push_back(jobs_.at(entry.second).job);
  return all;
}

std::optional<v1::Job> JobStore::FindSucceeded(const std::string& tenant, const std::string& cache_key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = by_sequence_.rbegin(); it != by_sequence_.rend(); ++it) {
    const v1::Job& job = jobs_.at(it->second).job;
    if (job.state() == v1::SUCCEEDED && job.tenant() == tenant && job.cache_key() == cache_key) return job;
  }
  return std::nullopt;
}

int JobStore::CountActive(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int active = 0;
  for (const auto& [name, entry] : jobs_) active += entry.job.tenant() == tenant && !IsTerminal(entry.job.state());
  return active;
}

size_t JobStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return jobs_.size();
}

}  // namespace onnxopt::server
