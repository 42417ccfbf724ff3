// The end-to-end harness: the real onnxopt-server binary on a loopback port, driven by the real
// onnxopt CLI or the client library. Every wait is bounded; every server is stopped with SIGTERM (the
// drain path) at the end of its test.
#ifndef ONNXOPT_TESTS_E2E_HARNESS_H_
#define ONNXOPT_TESTS_E2E_HARNESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/scrape_metrics.h"

extern char** environ;

namespace onnxopt::testing {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Starts `argv` with stdout/stderr in files, in `cwd` (empty: ours) with `extra_env` added to our
// environment; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err,
                   const fs::path& cwd = {}, const std::vector<std::string>& extra_env = {}) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> environment = extra_env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    const std::string key = variable.substr(0, variable.find('=') + 1);
    bool replaced = false;
    for (const auto& extra : extra_env) replaced |= extra.compare(0, key.size(), key) == 0;
    if (!replaced) environment.push_back(variable);
  }
  std::vector<char*> envp;
  for (auto& variable : environment) envp.push_back(variable.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// Waits for `pid` up to `timeout`, killing it past that; returns its exit code (-1 if killed).
inline int WaitFor(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// grpc.health.v1's status of `service` at `address` (the CLI's health check): 1 SERVING, 2 NOT_SERVING,
// 0 unknown, -1 RPC error.
inline int HealthStatus(const std::string& address, const std::string& service) {
  client::Client client(address);
  client.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  absl::StatusOr<int> status = client.CheckHealth(service);
  return status.ok() ? *status : -1;
}

class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("onnxopt_e2e_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (server_ > 0) StopServer();
    fs::remove_all(dir_);
  }

  // `cwd` and `env` (NAME=VALUE entries) for the server process; by default ours.
  void StartServer(std::vector<std::string> flags = {}, const fs::path& cwd = {}, const std::vector<std::string>& env = {}) {
    const fs::path port_file = dir_ / "port";
    fs::remove(port_file);
    std::vector<std::string> argv = {ONNXOPT_SERVER_BIN, "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
                                     absl::StrCat("--data-dir=", (dir_ / "data").string()),
                                     absl::StrCat("--port-file=", port_file.string())};
    argv.insert(argv.end(), flags.begin(), flags.end());
    server_ = Spawn(argv, dir_ / "server.out", dir_ / "server.err", cwd, env);
    ASSERT_GT(server_, 0);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!fs::exists(port_file) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(fs::exists(port_file)) << Slurp(dir_ / "server.err");
    address_ = absl::StrCat("127.0.0.1:", Slurp(port_file));
  }

  int StopServer() {
    kill(server_, SIGTERM);
    const int code = WaitFor(server_, std::chrono::seconds(60));
    server_ = -1;
    return code;
  }

  struct Result {
    int code;
    std::string out;
    std::string err;
  };
  Result Cli(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {ONNXOPT_CLI_BIN, "--server", address_};
    argv.insert(argv.end(), args.begin(), args.end());
    // In the test's folder: `submit --wait` without -o writes the optimized model to its working directory.
    const pid_t pid = Spawn(argv, dir_ / "cli.out", dir_ / "cli.err", dir_, env);
    Result result{pid > 0 ? WaitFor(pid, std::chrono::seconds(180)) : -1, "", ""};
    result.out = Slurp(dir_ / "cli.out");
    result.err = Slurp(dir_ / "cli.err");
    return result;
  }

  fs::path WriteFile(const std::string& name, const std::string& content) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  // A config that keeps a job in its benchmark phase until cancelled (bounded by its own budget). A test
  // that ends with one running should start its server with --drain-grace-seconds=0: TearDown's SIGTERM
  // otherwise waits out the 30 s default grace.
  fs::path LongJobConfig() {
    return WriteFile("long.json", R"({"benchmark": {"iterations": 100000, "time_budget_seconds": 600, "warmup_runs": 1}})");
  }

  std::string Submit(const fs::path& model, const fs::path& config) {
    Result result = Cli({"submit", model.string(), "--config", config.string()});
    EXPECT_EQ(result.code, 0) << result.err;
    return std::string(absl::StripTrailingAsciiWhitespace(result.out));
  }

  // Polls `status` until its text contains `needle`.
  bool WaitForStatus(const std::string& job, const std::string& needle, const std::vector<std::string>& env = {}) {
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < deadline) {
      if (absl::StrContains(Cli({"status", job}, env).out, needle)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // The metrics port the running server's banner names.
  int MetricsPort() {
    const std::string banner = Slurp(dir_ / "server.out");
    const size_t at = banner.find("metrics on port ");
    return at == std::string::npos ? -1 : std::stoi(banner.substr(at + 16));
  }

  fs::path dir_;
  pid_t server_ = -1;
  std::string address_;
};

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_E2E_HARNESS_H_
