// onnxopt-server replicas sharing one job store and one data folder, for the replica tests and the
// replica benchmark: each is started with --replica-id=<name> on a free loopback port, and stopped with
// SIGTERM when the deployment goes (unless it was killed first).
#ifndef ONNXOPT_TESTS_REPLICA_DEPLOYMENT_H_
#define ONNXOPT_TESTS_REPLICA_DEPLOYMENT_H_

#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "tests/e2e_harness.h"

namespace onnxopt::testing {

class ReplicaDeployment {
 public:
  // Replicas write their output and port files into `dir` and share `dir`/data; every one gets
  // --job-store=`job_store` and `common_flags`.
  ReplicaDeployment(fs::path dir, const std::string& job_store, std::vector<std::string> common_flags)
      : dir_(std::move(dir)), common_flags_(std::move(common_flags)) {
    fs::create_directories(dir_);
    common_flags_.insert(common_flags_.begin(), absl::StrCat("--job-store=", job_store));
  }
  ~ReplicaDeployment() {
    for (auto& [name, pid] : pids_) {
      if (pid > 0) {
        kill(pid, SIGTERM);
        WaitFor(pid, std::chrono::seconds(60));
      }
    }
  }
  ReplicaDeployment(const ReplicaDeployment&) = delete;
  ReplicaDeployment& operator=(const ReplicaDeployment&) = delete;

  // Starts the replica `name` with `flags` after the common ones (later flags win); its address, or ""
  // when it did not come up within 30 s (see Log).
  std::string Start(const std::string& name, const std::vector<std::string>& flags) {
    const fs::path port_file = dir_ / (name + ".port");
    std::vector<std::string> argv = {ONNXOPT_SERVER_BIN, "--listen=127.0.0.1:0", "--metrics-listen=",
                                     absl::StrCat("--data-dir=", data_dir().string()),
                                     absl::StrCat("--port-file=", port_file.string()),
                                     absl::StrCat("--replica-id=", name)};
    argv.insert(argv.end(), common_flags_.begin(), common_flags_.end());
    argv.insert(argv.end(), flags.begin(), flags.end());
    pids_[name] = Spawn(argv, dir_ / (name + ".out"), dir_ / (name + ".err"));
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (pids_[name] > 0 && !fs::exists(port_file) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!fs::exists(port_file)) return "";
    return addresses_[name] = absl::StrCat("127.0.0.1:", Slurp(port_file));
  }
  // SIGKILL: the replica gets no chance to drain or give anything back.
  void Kill(const std::string& name) {
    kill(pids_.at(name), SIGKILL);
    WaitFor(pids_.at(name), std::chrono::seconds(10));
    pids_[name] = -1;
  }
  std::string Address(const std::string& name) const { return addresses_.at(name); }
  pid_t Pid(const std::string& name) const { return pids_.at(name); }
  // Whether the replica's process is still alive (it was not killed, and has not exited).
  bool Running(const std::string& name) const {
    const pid_t pid = pids_.at(name);
    return pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0;
  }
  // What the replica wrote to stderr and stdout.
  std::string Log(const std::string& name) const {
    return Slurp(dir_ / (name + ".err")) + Slurp(dir_ / (name + ".out"));
  }
  fs::path data_dir() const { return dir_ / "data"; }

 private:
  const fs::path dir_;
  std::vector<std::string> common_flags_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, std::string> addresses_;
};

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_REPLICA_DEPLOYMENT_H_
