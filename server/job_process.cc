#include "server/job_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optimizer/failure.h"

extern char** environ;

namespace onnxopt::server {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Parsing a model to check it should take seconds; a file that takes longer is refused.
constexpr std::chrono::seconds kInspectTimeout{120};

// The longest line the worker's protocol has (an escaped location, a status message, with room).
constexpr size_t kMaxWorkerLineBytes = 1 << 20;

// Exit code of a child whose execv failed (127 is the dynamic loader's, e.g. out of memory).
constexpr int kExecFailed = 125;

fs::path DefaultWorkerBinary() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return (error ? fs::path(".") : self.parent_path()) / "onnxopt-worker";
}

namespace {

// The child's environment: ours, with TMPDIR pointing into its own folder.
std::vector<std::string> ChildEnvironment(const fs::path& tmp_dir) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, "TMPDIR=", 7) != 0) environment.emplace_back(*entry);
  }
  environment.push_back(absl::StrCat("TMPDIR=", tmp_dir.string()));
  return environment;
}

std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

int64_t WorkerAddressSpaceBytes(int64_t memory_limit_mb, int64_t model_bytes) {
  if (memory_limit_mb <= 0) return 0;
  return (memory_limit_mb << 20) + 2 * std::max<int64_t>(0, model_bytes);
}

namespace {

// What the child needs, prepared before fork: between fork and exec only async-signal-safe calls.
struct ChildSpec {
  std::vector<std::string> args;
  std::vector<std::string> environment;
  std::string folder;
  std::string log_path;
  rlim_t memory_bytes = 0;
  pid_t parent = 0;
};

// The child's side of fork: `argv` and `envp` point into `spec`, built before the fork.
[[noreturn]] void ExecWorkerChild(const ChildSpec& spec, char* const argv[], char* const envp[], int pipe_write) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the server
  if (::getppid() != spec.parent) ::_exit(126);
  ::setpgid(0, 0);                      // a terminal's Ctrl-C goes to the server, which decides
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the server blocks SIGTERM; the worker must not
  ::dup2(pipe_write, STDOUT_FILENO);
  // stderr (ONNX Runtime's and onnx's own messages, which quote the model's raw names) goes to the
  // run's log file, not into the server's log.
  const int log = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log >= 0) ::dup2(log, STDERR_FILENO);
  // Nothing else of the server's (open uploads, sockets, the job database) reaches the worker.
  if (::close_range(3, ~0U, 0) != 0) {
    for (int fd = 3; fd < 65536; ++fd) ::close(fd);
  }
  if (::chdir(spec.folder.c_str()) != 0) ::_exit(kExecFailed);
  if (spec.memory_bytes > 0) {
    struct rlimit limit = {spec.memory_bytes, spec.memory_bytes};
    ::setrlimit(RLIMIT_AS, &limit);
  }
  struct rlimit no_core = {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  ::execve(argv[0], argv, envp);
  ::_exit(kExecFailed);
}

// How a worker ended, as its parent watched it.
struct WorkerExit {
  bool timed_out = false;
  bool cancelled = false;
  bool overlong = false;  // it wrote a line longer than the protocol allows
  std::optional<absl::Status> reported;
  int wait_status = 0;
};

// Reads the worker's lines from `fd` until it closes, stopping the worker (SIGTERM, then SIGKILL after
// the grace) when `cancel` is set or the run's timeout passes; then reaps it.
WorkerExit WatchWorker(pid_t pid, int fd, const WorkerLimits& limits, const WorkerRun& run,
                       const std::atomic<bool>& cancel, const std::function<void(const WorkerLine&)>& on_line) {
  WorkerExit exit;
  const auto started = Clock::now();
  std::optional<Clock::time_point> terminated_at;
  bool killed = false;
  std::string buffer;
  char chunk[4096];
  for (bool open = true; open;) {
    struct pollfd poll_fd = {fd, POLLIN, 0};
    if (::poll(&poll_fd, 1, 100) > 0) {
      const ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n > 0) {
        buffer.append(chunk, static_cast<size_t>(n));
        for (size_t newline; (newline = buffer.find('\n')) != std::string::npos;) {
          WorkerLine line = ParseWorkerLine(buffer.substr(0, newline));
          buffer.erase(0, newline + 1);
          if (line.kind == WorkerLine::Kind::kStatus) exit.reported = line.status;
          if (on_line) on_line(line);
        }
        if (buffer.size() > kMaxWorkerLineBytes && !exit.overlong) {  // not the protocol: stop reading it
          exit.overlong = true;
          ::kill(pid, SIGKILL);
          buffer.clear();
        }
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        open = false;
      }
    }
    const auto now = Clock::now();
    if (!terminated_at && (cancel.load() || now - started > run.timeout)) {
      exit.timed_out = !cancel.load();
      exit.cancelled = !exit.timed_out;
      ::kill(pid, SIGTERM);
      terminated_at = now;
    }
    if (terminated_at && !killed && now - *terminated_at > limits.cancel_grace) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
  }
  ::close(fd);
  while (::waitpid(pid, &exit.wait_status, 0) < 0 && errno == EINTR) {
  }
  return exit;
}

// The run's status: what the worker reported, or why it has none.
absl::Status WorkerOutcome(const WorkerExit& exit, const WorkerLimits& limits, const WorkerRun& run) {
  if (exit.overlong) {
    return Failure(
        absl::StatusCode::kInternal, v1::ErrorReason::WORKER_CRASHED,
        absl::StrCat("the worker wrote a line of over ", kMaxWorkerLineBytes, " bytes, which is not its protocol"));
  }
  if (exit.timed_out) {
    return Failure(absl::StatusCode::kDeadlineExceeded, v1::ErrorReason::JOB_TIMEOUT,
                   absl::StrCat("the job ran past the server's limit of ", run.timeout.count(), " s"));
  }
  if (exit.reported) return *exit.reported;
  if (exit.cancelled) {
    return Failure(absl::StatusCode::kCancelled, v1::ErrorReason::CANCELLED, "the worker was stopped");
  }
  const int status = exit.wait_status;
  if (WIFEXITED(status) && WEXITSTATUS(status) == kExecFailed) {
    return Failure(absl::StatusCode::kInternal, v1::ErrorReason::WORKER_MISSING,
                   absl::StrCat("cannot execute ", limits.binary.string()));
  }
  std::string message;
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    message = absl::StrCat("the worker died with signal ", signal, " (", strsignal(signal), ") while working on this model");
  } else {
    message = absl::StrCat("the worker exited with code ", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                           " without reporting a result");
  }
  if (limits.memory_limit_mb > 0) {
    absl::StrAppend(&message, "; it may have run out of its ", limits.memory_limit_mb, " MiB memory limit");
  }
  return Failure(absl::StatusCode::kInternal, v1::ErrorReason::WORKER_CRASHED, message);
}

}  // namespace

absl::Status RunWorker(const WorkerLimits& limits, const WorkerRun& run, const std::atomic<bool>& cancel,
                       const std::function<void(const WorkerLine&)>& on_line) {
  if (::access(limits.binary.c_str(), X_OK) != 0) {
    return Failure(absl::StatusCode::kInternal, v1::ErrorReason::WORKER_MISSING,
                   absl::StrCat("cannot run ", limits.binary.string()));
  }
  const fs::path tmp_dir = run.folder / "tmp";
  std::error_code error;
  fs::create_directories(tmp_dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", tmp_dir.string(), ": ", error.message()));
  ChildSpec spec;
  spec.args = {limits.binary.string()};
  spec.args.insert(spec.args.end(), run.args.begin(), run.args.end());
  spec.environment = ChildEnvironment(tmp_dir);
  spec.folder = run.folder.string();
  spec.log_path = run.log.empty() ? std::string("/dev/null") : run.log.string();
  spec.memory_bytes = static_cast<rlim_t>(WorkerAddressSpaceBytes(limits.memory_limit_mb, run.mapped_bytes));
  spec.parent = ::getpid();
  std::vector<char*> argv = NullTerminated(spec.args);
  std::vector<char*> envp = NullTerminated(spec.environment);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::WORKER_SPAWN_FAILED,
                   absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) ExecWorkerChild(spec, argv.data(), envp.data(), pipe_fds[1]);
  ::close(pipe_fds[1]);
  return WorkerOutcome(WatchWorker(pid, pipe_fds[0], limits, run, cancel, on_line), limits, run);
}

absl::Status RunWorkerProcess(const WorkerLimits& limits, const WorkerJob& job, const std::atomic<bool>& cancel,
                              const std::function<void(const WorkerLine&)>& on_progress) {
  WorkerRun run;
  run.folder = job.job_dir;
  run.log = job.job_dir / "worker.log";
  run.timeout = limits.timeout;
  // The model and its external data, which ONNX Runtime maps (WorkerAddressSpaceBytes).
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(job.model.parent_path(), error)) {
    if (entry.is_regular_file(error)) run.mapped_bytes += static_cast<int64_t>(entry.file_size(error));
  }
  run.args = {absl::StrCat("--model=", job.model.string()), absl::StrCat("--output_dir=", job.output_dir.string()),
              absl::StrCat("--config=", job.config.string())};
  if (!job.inputs.empty()) run.args.push_back(absl::StrCat("--inputs=", job.inputs.string()));
  if (!job.digests.empty()) run.args.push_back(absl::StrCat("--digests=", job.digests.string()));
  if (!job.name.empty()) run.args.push_back(absl::StrCat("--job_name=", job.name));
  return RunWorker(limits, run, cancel, [&](const WorkerLine& line) {
    if (line.kind == WorkerLine::Kind::kProgress && on_progress) on_progress(line);
  });
}

absl::StatusOr<std::vector<std::string>> InspectModel(const WorkerLimits& limits, const fs::path& model,
                                                      const fs::path& folder) {
  WorkerRun run;
  run.folder = folder;
  run.timeout = std::min(limits.timeout, kInspectTimeout);
  run.args = {absl::StrCat("--inspect=", model.string())};
  std::vector<std::string> locations;
  const std::atomic<bool> never{false};
  absl::Status status = RunWorker(limits, run, never, [&](const WorkerLine& line) {
    if (line.kind == WorkerLine::Kind::kExternalData) locations.push_back(line.text);
  });
  if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED,
                   absl::StrCat("reading the model took longer than ", run.timeout.count(), " s"));
  }
  if (!status.ok()) return status;
  return locations;
}

}  // namespace onnxopt::server
