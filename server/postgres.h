// A thin layer over libpq for the PostgreSQL job store: connections that report errors as
// absl::Status, parameters bound as text or binary, and a small pool (a libpq connection serves one
// thread at a time).
#ifndef ONNXOPT_SERVER_POSTGRES_H_
#define ONNXOPT_SERVER_POSTGRES_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct pg_conn;
struct pg_result;

namespace onnxopt::server::pg {

struct ResultDeleter {
  void operator()(pg_result* result) const;
};
// Rows of a statement; columns are read as text (see Text, Int, Bytes).
class Result {
 public:
  explicit Result(pg_result* result) : result_(result) {}
  int rows() const;
  int64_t affected() const;  // rows an INSERT, UPDATE or DELETE changed
  std::string Text(int row, int column) const;
  int64_t Int(int row, int column) const;
  bool Bool(int row, int column) const;
  std::string Bytes(int row, int column) const;  // a bytea column

 private:
  std::unique_ptr<pg_result, ResultDeleter> result_;
};

// One statement parameter: text, bytes (sent binary, for bytea), or NULL.
struct Param {
  std::optional<std::string> value;
  bool binary = false;
  Param(std::string text) : value(std::move(text)) {}  // NOLINT: parameters read as literals
  Param(const char* text) : value(text) {}             // NOLINT
  Param(int64_t number) : value(std::to_string(number)) {}  // NOLINT
  Param(int number) : value(std::to_string(number)) {}      // NOLINT
  Param(bool flag) : value(flag ? "true" : "false") {}      // NOLINT
  static Param Bytes(std::string bytes) {
    Param param(std::move(bytes));
    param.binary = true;
    return param;
  }
  static Param Null() {
    Param param("");
    param.value.reset();
    return param;
  }
};

class Connection {
 public:
  // UNAVAILABLE (JOB_STORE_UNAVAILABLE) when the server cannot be reached or refuses us.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const std::string& uri);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Runs one statement. Errors: UNAVAILABLE when the connection broke, ABORTED for serialization
  // failures and deadlocks (retry), RESOURCE_EXHAUSTED (DISK_FULL) when the database cannot grow,
  // FAILED_PRECONDITION for a unique key already taken (UNIQUE_VIOLATION), INTERNAL otherwise.
  absl::StatusOr<Result> Exec(const std::string& sql, const std::vector<Param>& params = {});
  // BEGIN, `work`, COMMIT; ROLLBACK when `work` fails (its status is returned).
  absl::Status Transaction(const std::function<absl::Status()>& work);
  bool healthy() const;
  // Connected and outside any transaction: fit to be handed to another thread.
  bool reusable() const;
  // "database <db> on <host>:<port> as <user>": no password.
  std::string Describe() const;

 private:
  explicit Connection(pg_conn* connection) : connection_(connection) {}
  pg_conn* connection_;
};

// How many connections a pool opens, and how long one lives.
struct PoolOptions {
  int max_connections = 8;
  // A connection this old is closed when it is returned, or by the pool's sweep while it sits idle: PostgreSQL's
  // smart shutdown waits for every session to end, so a pool that kept its connections for ever would hold a
  // restart up until pg_ctl gave up; a failover's new primary likewise gets every connection within this time.
  std::chrono::seconds max_age{30};
};

class Pool {
 public:
  Pool(std::string uri, PoolOptions options);
  ~Pool();

  // A connection for one thread; back to the pool when it goes (or closed when it broke).
  class Lease {
   public:
    Lease(Pool* pool, std::unique_ptr<Connection> connection) : pool_(pool), connection_(std::move(connection)) {}
    Lease(Lease&&) = default;
    ~Lease();
    Connection* operator->() { return connection_.get(); }
    Connection& operator*() { return *connection_; }

   private:
    Pool* pool_;
    std::unique_ptr<Connection> connection_;
  };
  // Waits for a free connection (UNAVAILABLE after kAcquireTimeout), opening one while fewer than the
  // maximum are open.
  absl::StatusOr<Lease> Acquire();
  const PoolOptions& options() const { return options_; }
  static constexpr std::chrono::seconds kAcquireTimeout{30};

 private:
  void Return(std::unique_ptr<Connection> connection);
  bool TooOld(const Connection* connection, std::chrono::steady_clock::time_point now) const;
  // `connection` is about to be closed: it no longer counts as open; mutex_ held.
  void Forget(const Connection* connection);
  // Closes idle connections past max_age until the pool goes.
  void SweepIdle();
  const std::string uri_;
  const PoolOptions options_;
  std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::unordered_map<const Connection*, std::chrono::steady_clock::time_point> opened_at_;
  int open_ = 0;
  bool closing_ = false;
  std::condition_variable sweep_;
  std::thread sweeper_;
};

}  // namespace onnxopt::server::pg

#endif  // ONNXOPT_SERVER_POSTGRES_H_
