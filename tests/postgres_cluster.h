// A throwaway PostgreSQL cluster for tests and benchmarks: Debian's postgresql-15 (scripts/setup.sh
// installs it), initdb'd into a temporary folder, serving on a free loopback port with trust
// authentication, stopped (immediate mode) and removed when destroyed. PostgreSQL refuses to run as root, so
// under root the cluster runs as the unprivileged user `nobody`.
#ifndef ONNXOPT_TESTS_POSTGRES_CLUSTER_H_
#define ONNXOPT_TESTS_POSTGRES_CLUSTER_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace onnxopt::testing {

class PostgresCluster {
 public:
  // Where Debian keeps the server programs; ONNXOPT_PG_BINDIR overrides.
  static std::filesystem::path BinDir() {
    if (const char* dir = std::getenv("ONNXOPT_PG_BINDIR")) return dir;
    return "/usr/lib/postgresql/15/bin";
  }

  // FAILED_PRECONDITION when PostgreSQL is not installed (scripts/setup.sh installs it). By default
  // commits return before their WAL is written (synchronous_commit=off, fast for tests); `durable`
  // commits as production does, so that a crash of the server (Stop) loses no acknowledged commit:
  // what the chaos tests need.
  static absl::StatusOr<std::unique_ptr<PostgresCluster>> Start(const std::filesystem::path& dir,
                                                                bool durable = false) {
    namespace fs = std::filesystem;
    if (::access((BinDir() / "initdb").c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("no PostgreSQL server programs in ", BinDir().string(),
                                                        ": run scripts/setup.sh (it installs postgresql-15)"));
    }
    std::unique_ptr<PostgresCluster> cluster(new PostgresCluster(dir));
    std::error_code error;
    fs::remove_all(dir, error);
    fs::create_directories(dir, error);
    if (error) return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", error.message()));
    if (::geteuid() == 0) {
      const passwd* nobody = ::getpwnam("nobody");
      if (nobody == nullptr) return absl::FailedPreconditionError("running as root, and there is no user nobody");
      cluster->uid_ = nobody->pw_uid;
      cluster->gid_ = nobody->pw_gid;
      if (::chown(dir.c_str(), cluster->uid_, cluster->gid_) != 0) {
        return absl::InternalError(absl::StrCat("cannot hand ", dir.string(), " to nobody"));
      }
      // nobody must be able to reach the folder: its parents must be searchable.
      for (fs::path parent = dir.parent_path(); !parent.empty() && parent != parent.root_path();
           parent = parent.parent_path()) {
        if (::access(parent.c_str(), F_OK) == 0) fs::permissions(parent, fs::perms::others_exec, fs::perm_options::add, error);
      }
    }
    cluster->port_ = FreePort();
    const std::string data = (dir / "data").string();
    int code = cluster->Run({(BinDir() / "initdb").string(), "-D", data, "-U", "onnxopt", "--auth=trust", "-E", "UTF8",
                             "--no-sync", "--no-instructions"});
    if (code != 0) return cluster->Failure("initdb", code);
    const std::string options = absl::StrCat("-p ", cluster->port_, " -k ", dir.string(),
                                             " -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=",
                                             durable ? "on" : "off", " "
                                             "-c full_page_writes=off -c max_connections=300");
    cluster->options_ = options;
    if (absl::Status started = cluster->StartServer(); !started.ok()) return started;
    return cluster;
  }

  ~PostgresCluster() {
    Stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Stops the server at once (immediate shutdown: what a crash or a lost host looks like to clients).
  void Stop() {
    if (!running_) return;
    running_ = false;
    Run({(BinDir() / "pg_ctl").string(), "-D", (dir_ / "data").string(), "-m", "immediate", "-w", "stop"});
  }

  // Starts the server again after Stop (the same port and data).
  absl::Status StartServer() {
    if (running_) return absl::OkStatus();
    const int code = Run({(BinDir() / "pg_ctl").string(), "-D", (dir_ / "data").string(), "-l",
                          (dir_ / "server.log").string(), "-w", "-t", "60", "-o", options_, "start"});
    if (code != 0) return Failure("pg_ctl start", code);
    running_ = true;
    return absl::OkStatus();
  }

  // Restarts the server: "fast" (connections are cut and open transactions rolled back) or "smart"
  // (waits for clients to disconnect, bounded by `timeout_seconds`). With the options it started with.
  absl::Status Restart(const std::string& mode, int timeout_seconds = 60) {
    const int code = Run({(BinDir() / "pg_ctl").string(), "-D", (dir_ / "data").string(), "-m", mode, "-w", "-t",
                          std::to_string(timeout_seconds), "restart"});
    if (code != 0) return Failure(absl::StrCat("pg_ctl restart -m ", mode), code);
    return absl::OkStatus();
  }
  // Cuts every other connection to `database` (pg_terminate_backend); how many it cut.
  absl::StatusOr<int> TerminateConnections(const std::string& database) const {
    PGconn* connection = PQconnectdb(Uri("postgres").c_str());
    absl::StatusOr<int> cut = 0;
    if (PQstatus(connection) != CONNECTION_OK) {
      cut = absl::UnavailableError(PQerrorMessage(connection));
    } else {
      PGresult* result = PQexec(connection, absl::StrCat("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                                         "WHERE pid <> pg_backend_pid() AND datname = '",
                                                         database, "'").c_str());
      if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        cut = absl::InternalError(PQresultErrorMessage(result));
      } else {
        cut = std::atoi(PQgetvalue(result, 0, 0));
      }
      PQclear(result);
    }
    PQfinish(connection);
    return cut;
  }

  int port() const { return port_; }
  std::string Uri(const std::string& database) const {
    return absl::StrCat("postgresql://onnxopt@127.0.0.1:", port_, "/", database);
  }

  // A fresh database (one per test, so tests share a cluster but not their jobs).
  absl::Status CreateDatabase(const std::string& name) const {
    PGconn* connection = PQconnectdb(Uri("postgres").c_str());
    absl::Status status = absl::OkStatus();
    if (PQstatus(connection) != CONNECTION_OK) {
      status = absl::UnavailableError(PQerrorMessage(connection));
    } else {
      PGresult* result = PQexec(connection, absl::StrCat("CREATE DATABASE ", name).c_str());
      if (PQresultStatus(result) != PGRES_COMMAND_OK) status = absl::InternalError(PQresultErrorMessage(result));
      PQclear(result);
    }
    PQfinish(connection);
    return status;
  }

 private:
  explicit PostgresCluster(std::filesystem::path dir) : dir_(std::move(dir)) {}

  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = 0;
    ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    socklen_t length = sizeof(address);
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port = ntohs(address.sin_port);
    }
    ::close(fd);
    return port;
  }

  // Runs a PostgreSQL program (as nobody under root), its output appended to setup.log; its exit code.
  int Run(const std::vector<std::string>& argv) const {
    const std::string log = (dir_ / "setup.log").string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      if (uid_ != 0 && (::setgroups(0, nullptr) != 0 || ::setgid(gid_) != 0 || ::setuid(uid_) != 0)) ::_exit(126);
      if (::chdir(dir_.c_str()) != 0) ::_exit(126);
      std::vector<char*> args;
      for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  absl::Status Failure(const std::string& what, int code) const {
    std::ifstream log(dir_ / "setup.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    return absl::InternalError(absl::StrCat(what, " exited with ", code, ":\n", text));
  }

  const std::filesystem::path dir_;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  int port_ = 0;
  std::string options_;  // the server's command-line options (port, socket folder, settings)
  bool running_ = false;
};

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_POSTGRES_CLUSTER_H_
