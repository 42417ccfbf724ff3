#include "server/postgres.h"

#include <libpq-fe.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "optimizer/failure.h"

namespace onnxopt::server::pg {
namespace {

std::string ConnectionError(pg_conn* connection) {
  return std::string(absl::StripTrailingAsciiWhitespace(connection != nullptr ? PQerrorMessage(connection) : "out of memory"));
}

}  // namespace

void ResultDeleter::operator()(pg_result* result) const { PQclear(result); }

int Result::rows() const { return PQntuples(result_.get()); }

int64_t Result::affected() const {
  int64_t count = 0;
  return absl::SimpleAtoi(PQcmdTuples(result_.get()), &count) ? count : 0;
}


std::string Result::Text(int row, int column) const {
  return std::string(PQgetvalue(result_.get(), row, column),
                     static_cast<size_t>(PQgetlength(result_.get(), row, column)));
}

int64_t Result::Int(int row, int column) const {
  int64_t value = 0;
  return absl::SimpleAtoi(Text(row, column), &value) ? value : 0;
}

bool Result::Bool(int row, int column) const { return Text(row, column) == "t"; }

std::string Result::Bytes(int row, int column) const {
  size_t length = 0;
  unsigned char* bytes =
      PQunescapeBytea(reinterpret_cast<const unsigned char*>(PQgetvalue(result_.get(), row, column)), &length);
  if (bytes == nullptr) return "";
  std::string out(reinterpret_cast<const char*>(bytes), length);
  PQfreemem(bytes);
  return out;
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const std::string& uri) {
  // Defaults first: what the URI says wins. A database that stops answering (failover, a partition
  // without a reset) must fail calls within seconds, not hang leases and shutdown: TCP keepalives and a
  // user timeout on the socket, and server-side limits on statements, lock waits and idle transactions.
  const char* keywords[] = {"application_name", "connect_timeout", "keepalives", "keepalives_idle",
                            "keepalives_interval", "keepalives_count", "tcp_user_timeout", "options", "dbname",
                            nullptr};
  const char* values[] = {"onnxopt-server", "10", "1", "10", "5", "3", "30000",
                          "-c client_min_messages=warning -c statement_timeout=30s -c lock_timeout=10s "
                          "-c idle_in_transaction_session_timeout=60s",
                          uri.c_str(), nullptr};
  pg_conn* connection = PQconnectdbParams(keywords, values, /*expand_dbname=*/1);
  if (connection == nullptr || PQstatus(connection) != CONNECTION_OK) {
    const std::string message = ConnectionError(connection);
    PQfinish(connection);
    return Failure(absl::StatusCode::kUnavailable, v1::ErrorReason::JOB_STORE_UNAVAILABLE,
                   absl::StrCat("cannot connect to PostgreSQL: ", message));
  }
  return std::unique_ptr<Connection>(new Connection(connection));
}

Connection::~Connection() { PQfinish(connection_); }

bool Connection::healthy() const { return PQstatus(connection_) == CONNECTION_OK; }

bool Connection::reusable() const { return healthy() && PQtransactionStatus(connection_) == PQTRANS_IDLE; }

std::string Connection::Describe() const {
  return absl::StrCat("database ", PQdb(connection_), " on ", PQhost(connection_), ":", PQport(connection_), " as ",
                      PQuser(connection_));
}

absl::StatusOr<Result> Connection::Exec(const std::string& sql, const std::vector<Param>& params) {
  std::vector<const char*> values;
  std::vector<int> lengths, formats;
  for (const Param& param : params) {
    values.push_back(param.value ? param.value->c_str() : nullptr);
    lengths.push_back(param.value ? static_cast<int>(param.value->size()) : 0);
    formats.push_back(param.binary ? 1 : 0);
  }
  // Without parameters, PQexec: it also runs several statements at once (migrations).
  pg_result* raw = params.empty() ? PQexec(connection_, sql.c_str())
                                  : PQexecParams(connection_, sql.c_str(), static_cast<int>(params.size()), nullptr,
                                                 values.data(), lengths.data(), formats.data(), /*resultFormat=*/0);
  Result result(raw);
  const ExecStatusType status = raw == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(raw);
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return result;
  if (!healthy()) {
    return Failure(absl::StatusCode::kUnavailable, v1::ErrorReason::JOB_STORE_UNAVAILABLE,
                   absl::StrCat("lost the PostgreSQL connection: ", ConnectionError(connection_)));
  }
  const char* state = raw == nullptr ? nullptr : PQresultErrorField(raw, PG_DIAG_SQLSTATE);
  const std::string code = state == nullptr ? "" : state;
  const std::string message = absl::StrCat(
      "postgresql: ", absl::StripTrailingAsciiWhitespace(raw == nullptr ? ConnectionError(connection_)
                                                                        : PQresultErrorMessage(raw)));
  if (code == "40001" || code == "40P01") return absl::AbortedError(message);
  if (code == "23505") {
    return Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::UNIQUE_VIOLATION, message);
  }
  if (absl::StartsWith(code, "53")) {
    return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::DISK_FULL, message);
  }
  if (absl::StartsWith(code, "08")) {
    return Failure(absl::StatusCode::kUnavailable, v1::ErrorReason::JOB_STORE_UNAVAILABLE, message);
  }
  return absl::InternalError(message);
}

absl::Status Connection::Transaction(const std::function<absl::Status()>& work) {
  if (absl::StatusOr<Result> begun = Exec("BEGIN"); !begun.ok()) return begun.status();
  absl::Status status = work();
  if (status.ok()) {
    absl::StatusOr<Result> committed = Exec("COMMIT");
    if (committed.ok()) return absl::OkStatus();
    status = committed.status();
  }
  (void)Exec("ROLLBACK");
  return status;
}

Pool::Pool(std::string uri, PoolOptions options)
    : uri_(std::move(uri)), options_(options), sweeper_([this] { SweepIdle(); }) {}

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  sweep_.notify_all();
  sweeper_.join();
}

bool Pool::TooOld(const Connection* connection, std::chrono::steady_clock::time_point now) const {
  auto opened = opened_at_.find(connection);
  return opened != opened_at_.end() && now - opened->second >= options_.max_age;
}

void Pool::Forget(const Connection* connection) {
  opened_at_.erase(connection);
  --open_;
}

void Pool::SweepIdle() {
  const auto period = std::max(std::chrono::milliseconds(100),
                               std::chrono::duration_cast<std::chrono::milliseconds>(options_.max_age) / 4);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!sweep_.wait_for(lock, period, [&] { return closing_; })) {
    std::vector<std::unique_ptr<Connection>> expired;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (!TooOld(it->get(), now)) {
        ++it;
        continue;
      }
      Forget(it->get());
      expired.push_back(std::move(*it));
      it = idle_.erase(it);
    }
    if (expired.empty()) continue;
    returned_.notify_all();
    lock.unlock();
    expired.clear();  // closed outside the lock
    lock.lock();
  }
}

Pool::Lease::~Lease() {
  if (pool_ != nullptr && connection_ != nullptr) pool_->Return(std::move(connection_));
}

absl::StatusOr<Pool::Lease> Pool::Acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!returned_.wait_for(lock, kAcquireTimeout,
                          [&] { return !idle_.empty() || open_ < options_.max_connections; })) {
    return Failure(absl::StatusCode::kUnavailable, v1::ErrorReason::JOB_STORE_UNAVAILABLE,
                   absl::StrCat("all ", options_.max_connections, " database connections stayed busy for 30 s"));
  }
  while (!idle_.empty()) {
    std::unique_ptr<Connection> connection = std::move(idle_.back());
    idle_.pop_back();
    if (!TooOld(connection.get(), std::chrono::steady_clock::now())) return Lease(this, std::move(connection));
    Forget(connection.get());  // past its age between two sweeps: closed, not handed out
  }
  ++open_;
  lock.unlock();
  absl::StatusOr<std::unique_ptr<Connection>> connection = Connection::Open(uri_);
  lock.lock();
  if (!connection.ok()) {
    --open_;
    returned_.notify_one();
    return connection.status();
  }
  opened_at_[connection->get()] = std::chrono::steady_clock::now();
  return Lease(this, *std::move(connection));
}

void Pool::Return(std::unique_ptr<Connection> connection) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (connection->reusable() && !TooOld(connection.get(), std::chrono::steady_clock::now())) {
    idle_.push_back(std::move(connection));
  } else {
    // Broken, or old enough to make way for a fresh one: closed; the next Acquire opens another.
    Forget(connection.get());
    lock.unlock();
    connection.reset();
  }
  returned_.notify_one();
}

}  // namespace onnxopt::server::pg
