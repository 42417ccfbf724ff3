// onnxopt-server: the gRPC optimization service.
//
//   onnxopt-server [--listen=127.0.0.1:50051] [--workers=2] [--queue-capacity=64]
//                  [--data-dir=onnxopt-data] [--max-upload-bytes=...] [--metrics-listen=127.0.0.1:9464]
//
// Each job runs in an onnxopt-worker child process (--job-memory-limit-mb, --job-timeout-seconds), so a
// model that crashes or exhausts it fails its own job only.
//
// Beyond one machine: replicas share a PostgreSQL job store (--job-store=postgresql://...) and the
// data folder (a shared volume); --role=api serves the API only, --role=worker runs jobs only.
//
// SIGTERM or SIGINT drains: new jobs and uploads are refused (UNAVAILABLE), health turns NOT_SERVING,
// running jobs get --drain-grace-seconds to finish, and whatever is left stays queued for the next start.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "server/blob_store.h"
#include "server/flag_spelling.h"
#include "server/job_manager.h"
#include "server/job_store.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/service.h"
#include "server/tls.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address to listen on (port 0 picks a free port)");
ABSL_FLAG(int, workers, 2, "worker threads running jobs");
ABSL_FLAG(int, queue_capacity, 64, "jobs that may wait in the queue before CreateJob answers RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, data_dir, "onnxopt-data", "folder for the job database, blobs and job results");
ABSL_FLAG(int64_t, max_upload_bytes, int64_t{8} << 30, "largest file (model or external data) one upload may be");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464", "address serving Prometheus /metrics; empty disables");
ABSL_FLAG(int, drain_grace_seconds, 30, "on SIGTERM, how long running jobs may take to finish");
ABSL_FLAG(std::string, worker_binary, "", "the onnxopt-worker each job runs in (default: next to this binary)");
ABSL_FLAG(int64_t, job_memory_limit_mb, 16384, "address-space limit of a job's worker process in MiB; 0: none");
ABSL_FLAG(int, job_timeout_seconds, 3600, "wall-time limit of one job; past it the job fails with JOB_TIMEOUT");
ABSL_FLAG(double, upload_expiry_hours, 24, "partial uploads nobody wrote to for this long are deleted (checked at start and hourly)");
ABSL_FLAG(std::string, port_file, "", "if set, the bound gRPC port is written to this file once serving");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve gRPC over TLS (with --tls-key); empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA bundle: require client certificates signed by it (mutual TLS)");
ABSL_FLAG(double, job_retention_hours, 720,
          "finished jobs (record, artifacts, blobs no other job uses) are deleted this long after they ended; "
          "0 keeps them (checked at start and hourly)");
ABSL_FLAG(double, scrub_interval_hours, 24,
          "every stored blob and artifact is read back against its SHA-256 at start and then this often: a corrupt "
          "blob is deleted, a corrupt artifact marked and never served; 0: no scrub (downloads still check)");
ABSL_FLAG(int, tenant_max_active_jobs, 0, "queued + running jobs one tenant may have; 0: no quota beyond the queue");
ABSL_FLAG(int64_t, tenant_max_stored_bytes, 0,
          "bytes of blobs and partial uploads one tenant may store (checked when an upload starts); 0: no quota");
ABSL_FLAG(std::string, job_store, "sqlite",
          "where jobs are kept: sqlite (<data_dir>/jobs.sqlite3, one server), sqlite:<path>, or a PostgreSQL "
          "connection URI postgresql://user@host:5432/db shared by replicas (password: PGPASSWORD or ~/.pgpass)");
ABSL_FLAG(int, job_store_connections, 8,
          "PostgreSQL connections one replica opens for requests, at most (two more renew leases); replicas x "
          "(this + 2) must stay under the database's max_connections");
ABSL_FLAG(int, job_store_connection_max_age_seconds, 30,
          "a PostgreSQL connection this old is closed (when returned, or while idle) and another opened on need: "
          "a smart shutdown of the database waits for every session, and a failover's new primary gets them all");
ABSL_FLAG(std::string, role, "all",
          "all: serve the API and run jobs; api: serve the API only; worker: run jobs only (serves gRPC health and "
          "metrics). api and worker need a shared job store");
ABSL_FLAG(std::string, replica_id, "", "this replica's name in jobs' worker field and leases (default: host-pid)");
ABSL_FLAG(std::string, worker_device, "any",
          "which jobs this replica runs: any; cuda (only jobs asking for the CUDA device); cpu (only the others)");
ABSL_FLAG(int, lease_seconds, 30,
          "a running job's lease, renewed while it runs; when a replica dies, its jobs go to others after this");
ABSL_FLAG(int, max_attempts, 3, "starts a job gets when replicas running it die; then it fails with LEASE_EXPIRED");
ABSL_FLAG(int, poll_interval_ms, 500, "how often idle workers look for jobs queued on other replicas");
ABSL_FLAG(std::string, log_format, "text",
          "text: 'onnxopt-server: ...' lines; json: one object a line with time, level, msg, job and tenant");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "lines 'sha256(token) tenant [admin]': every RPC needs 'authorization: Bearer <token>' and sees only its "
          "tenant's jobs and blobs; re-read on SIGHUP. Empty: no authentication, one tenant");

namespace {

constexpr char kServiceName[] = "onnxopt.v1.Optimizer";

// Runs `work` now and then every `interval` on its own thread, until destroyed (which waits for a run
// in progress to end).
class PeriodicTask {
 public:
  PeriodicTask(std::chrono::seconds interval, std::function<void()> work)
      : interval_(interval), work_(std::move(work)), thread_([this] { Run(); }) {}
  ~PeriodicTask() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    do {
      lock.unlock();
      work_();
      lock.lock();
    } while (!wake_.wait_for(lock, interval_, [this] { return stopping_; }));
  }

  const std::chrono::seconds interval_;
  const std::function<void()> work_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is set
};

// The hourly tidy-up: abandoned partial uploads, then finished jobs past their retention, blobs no job
// uses and stray job folders.
void Tidy(onnxopt::server::TenantBlobStores& blobs, onnxopt::server::JobManager& jobs, std::chrono::seconds upload_age,
          std::chrono::seconds retention) {
  int removed = 0;
  blobs.ForEach([&](const std::string&, onnxopt::server::BlobStore& store) {
    removed += store.ExpireStaleUploads(upload_age);
  });
  if (removed > 0) {
    onnxopt::server::Log(onnxopt::server::LogLevel::kInfo, absl::StrCat("removed ", removed, " abandoned partial upload(s)"));
  }
  const auto collected = jobs.CollectGarbage(retention, upload_age);
  if (collected.jobs + collected.blobs + collected.folders > 0) {
    onnxopt::server::Log(onnxopt::server::LogLevel::kInfo,
                         absl::StrCat("deleted ", collected.jobs, " expired job(s), ", collected.blobs,
                                      " unused blob(s), ", collected.folders, " stray job folder(s); ",
                                      collected.bytes, " bytes freed"));
  }
}

// A scrub of the stored bytes (job_scrub.h), logged.
void ScrubStoredBytes(onnxopt::server::JobManager& jobs) {
  const auto started = std::chrono::steady_clock::now();
  const onnxopt::server::JobScrub::Findings findings = jobs.Scrub();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const bool clean = findings.corrupt_blobs.empty() && findings.corrupt_artifacts.empty();
  onnxopt::server::Log(clean ? onnxopt::server::LogLevel::kInfo : onnxopt::server::LogLevel::kError,
                       absl::StrFormat("scrub: %d blob(s) and %d artifact(s), %.1f MiB in %.1f s: %d corrupt blob(s) "
                                       "deleted, %d corrupt artifact(s) marked",
                                       findings.blobs_checked, findings.artifacts_checked,
                                       findings.bytes_read / 1048576.0, seconds, findings.corrupt_blobs.size(),
                                       findings.corrupt_artifacts.size()));
}

// The replica's background work, from its start until it stops: the hourly tidy-up and, unless
// --scrub-interval-hours is 0, the scrub.
class Housekeeping {
 public:
  Housekeeping(onnxopt::server::TenantBlobStores& blobs, onnxopt::server::JobManager& jobs)
      : janitor_(std::chrono::hours(1), [&blobs, &jobs, upload_age = Hours(absl::GetFlag(FLAGS_upload_expiry_hours)),
                                         retention = Hours(absl::GetFlag(FLAGS_job_retention_hours))] {
          Tidy(blobs, jobs, upload_age, retention);
        }) {
    if (const double hours = absl::GetFlag(FLAGS_scrub_interval_hours); hours > 0) {
      scrubber_.emplace(std::max(std::chrono::seconds(1), Hours(hours)), [&jobs] { ScrubStoredBytes(jobs); });
    }
  }

 private:
  static std::chrono::seconds Hours(double hours) { return std::chrono::seconds(static_cast<int64_t>(hours * 3600)); }

  PeriodicTask janitor_;
  std::optional<PeriodicTask> scrubber_;
};

int Fail(const std::string& what, const absl::Status& status) {
  onnxopt::server::Log(onnxopt::server::LogLevel::kError, absl::StrCat(what, ": ", status.ToString()));
  return 1;
}

namespace srv = onnxopt::server;

// Parses the dashed flags (abseil wants underscores); an exit code when the program should stop here
// (--help printed).
std::optional<int> ParseFlags(int argc, char** argv) {
  absl::SetProgramUsageMessage("the onnxopt model optimization gRPC service");
  // abseil's --help lists the flags of files named like the program; ours live in server/main.cc.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "server/main.cc"); };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  srv::SpelledArguments spelled = srv::ToAbseilSpelling(std::vector<std::string>(argv + 1, argv + argc));
  for (const std::string& argument : spelled.arguments) {
    if (argument == "--help" || argument == "-help" || argument == "-h") {
      std::cout << srv::DashedFlagsHelp(absl::StrCat(argv[0], ": ", absl::ProgramUsageMessage()), "server/main.cc");
      return 0;
    }
  }
  std::vector<char*> abseil_argv = {argv[0]};
  for (std::string& argument : spelled.arguments) abseil_argv.push_back(argument.data());
  absl::ParseCommandLine(static_cast<int>(abseil_argv.size()), abseil_argv.data());
  if (absl::Status format = srv::SetLogFormat(absl::GetFlag(FLAGS_log_format)); !format.ok()) return Fail("flags", format);
  for (const std::string& note : spelled.notes) srv::Log(srv::LogLevel::kWarning, note);
  return std::nullopt;
}

absl::Status CheckFlagRanges() {
  if (absl::GetFlag(FLAGS_workers) < 1 || absl::GetFlag(FLAGS_queue_capacity) < 1 ||
      absl::GetFlag(FLAGS_max_upload_bytes) < 1 || absl::GetFlag(FLAGS_drain_grace_seconds) < 0 ||
      absl::GetFlag(FLAGS_job_memory_limit_mb) < 0 || absl::GetFlag(FLAGS_job_timeout_seconds) < 1 ||
      !(absl::GetFlag(FLAGS_upload_expiry_hours) > 0) || absl::GetFlag(FLAGS_tenant_max_active_jobs) < 0 ||
      absl::GetFlag(FLAGS_tenant_max_stored_bytes) < 0 || !(absl::GetFlag(FLAGS_job_retention_hours) >= 0) ||
      !(absl::GetFlag(FLAGS_scrub_interval_hours) >= 0) ||
      absl::GetFlag(FLAGS_lease_seconds) < 2 || absl::GetFlag(FLAGS_max_attempts) < 1 ||
      absl::GetFlag(FLAGS_poll_interval_ms) < 10 || absl::GetFlag(FLAGS_job_store_connections) < 2 ||
      absl::GetFlag(FLAGS_job_store_connection_max_age_seconds) < 1) {
    return absl::InvalidArgumentError(
        "workers, queue_capacity, max_upload_bytes, job_timeout_seconds and max_attempts must be "
        ">= 1, job_store_connection_max_age_seconds >= 1, lease_seconds >= 2, poll_interval_ms >= 10, job_store_connections >= 2, "
        "drain_grace_seconds, "
        "job_memory_limit_mb, job_retention_hours, scrub_interval_hours and the tenant quotas >= 0, "
        "upload_expiry_hours > 0");
  }
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "all" && role != "api" && role != "worker") {
    return absl::InvalidArgumentError(absl::StrCat("role must be all, api or worker, not '", role, "'"));
  }
  if (role != "all" && !srv::IsSharedJobStore(absl::GetFlag(FLAGS_job_store))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--role=", role, " needs a job store other replicas share (--job-store=postgresql://...); "
        "the embedded SQLite store serves one server"));
  }
  return absl::OkStatus();
}

// --replica-id, or host-pid.
absl::StatusOr<std::string> ReplicaId() {
  std::string replica_id = absl::GetFlag(FLAGS_replica_id);
  if (replica_id.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    replica_id = absl::StrCat(host, "-", ::getpid());
  }
  if (replica_id.size() > 128 || !std::all_of(replica_id.begin(), replica_id.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
      })) {
    return absl::InvalidArgumentError("replica_id must be 1 to 128 characters of A-Z, a-z, 0-9, '.', '-', '_'");
  }
  return replica_id;
}

// The server's own temporary files (ONNX Runtime's telemetry folder) stay inside the data folder too;
// what a killed server left there is cleared at start. Each job's worker has its own TMPDIR. Replicas
// share the data folder, so each keeps its temporary files in a local folder of its own.
absl::Status UsePrivateTempDir(const std::filesystem::path& data_dir, const std::string& replica_id) {
  std::error_code error;
  const std::filesystem::path temp_dir = srv::IsSharedJobStore(absl::GetFlag(FLAGS_job_store))
                                             ? std::filesystem::temp_directory_path(error) / absl::StrCat("onnxopt-", replica_id)
                                             : data_dir / "tmp";
  std::filesystem::remove_all(temp_dir, error);
  std::filesystem::create_directories(temp_dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", temp_dir.string()));
  ::setenv("TMPDIR", temp_dir.c_str(), 1);
  return absl::OkStatus();
}

absl::StatusOr<srv::JobManagerOptions> JobManagerOptionsFromFlags(const std::filesystem::path& data_dir,
                                                                  const std::string& replica_id) {
  absl::StatusOr<srv::WorkerDevice> device = srv::ParseWorkerDevice(absl::GetFlag(FLAGS_worker_device));
  if (!device.ok()) return device.status();
  std::error_code error;
  srv::JobManagerOptions options;
  options.data_dir = data_dir;
  options.workers = absl::GetFlag(FLAGS_workers);
  options.queue_capacity = static_cast<size_t>(absl::GetFlag(FLAGS_queue_capacity));
  options.max_active_jobs_per_tenant = absl::GetFlag(FLAGS_tenant_max_active_jobs);
  options.worker.binary = absl::GetFlag(FLAGS_worker_binary).empty()
                              ? srv::DefaultWorkerBinary()
                              : std::filesystem::absolute(absl::GetFlag(FLAGS_worker_binary), error);
  options.worker.memory_limit_mb = absl::GetFlag(FLAGS_job_memory_limit_mb);
  options.worker.timeout = std::chrono::seconds(absl::GetFlag(FLAGS_job_timeout_seconds));
  options.run_jobs = absl::GetFlag(FLAGS_role) != "api";
  options.replica_id = replica_id;
  options.device = *device;
  options.lease = std::chrono::seconds(absl::GetFlag(FLAGS_lease_seconds));
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.poll = std::chrono::milliseconds(absl::GetFlag(FLAGS_poll_interval_ms));
  return options;
}

// Builds and starts the gRPC server on --listen; its port in `port`.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(srv::OptimizerService* service,
                                                        const std::shared_ptr<grpc::ServerCredentials>& credentials,
                                                        int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  const bool serves_api = absl::GetFlag(FLAGS_role) != "worker";
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), credentials, port);
  builder.SetMaxReceiveMessageSize(16 << 20);
  if (serves_api) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen)));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  if (serves_api) server->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  return server;
}

std::string Banner(const srv::JobManagerOptions& options, const srv::JobStore& store, const srv::Authenticator& auth,
                   int port, int metrics_port) {
  std::string banner = absl::StrCat(
      "onnxopt-server ", onnxopt::kOptimizerVersion, " (ONNX Runtime ", onnxopt::OrtVersion(), ") replica ",
      options.replica_id, ", role ", absl::GetFlag(FLAGS_role), ", listening on port ", port, ", data in ",
      options.data_dir.string(), ", jobs in ", store.Describe(), ", ",
      options.run_jobs ? absl::StrCat(options.workers, " workers") : std::string("no workers"), ", queue of ",
      options.queue_capacity,
      absl::GetFlag(FLAGS_tls_cert).empty()          ? ", plaintext"
      : absl::GetFlag(FLAGS_tls_client_ca).empty() ? ", TLS"
                                                     : ", mutual TLS");
  if (metrics_port > 0) absl::StrAppend(&banner, ", metrics on port ", metrics_port);
  if (auth.enabled()) absl::StrAppend(&banner, ", bearer tokens of ", auth.tokens(), " caller(s)");
  return banner;
}

// Blocks the shutdown signals in every thread (those started later inherit the mask); the main thread
// waits for them with sigwait.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int signal : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&signals, signal);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Serves until SIGTERM or SIGINT; SIGHUP reloads the bearer tokens.
int WaitForShutdown(const sigset_t& signals, srv::Authenticator& auth) {
  int received = 0;
  while (sigwait(&signals, &received) == 0 && received == SIGHUP) {
    absl::Status reloaded = auth.Reload();
    if (reloaded.ok()) {
      srv::Log(srv::LogLevel::kInfo, absl::StrCat("SIGHUP, ", auth.tokens(), " token(s) loaded"));
    } else {
      srv::Log(srv::LogLevel::kError, absl::StrCat("SIGHUP, tokens kept as they were: ", reloaded.ToString()));
    }
  }
  return received;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> exit_code = ParseFlags(argc, argv)) return *exit_code;
  const sigset_t signals = BlockShutdownSignals();
  // Absolute: each job's worker runs in its own job folder, so relative paths would not reach the files.
  std::error_code error;
  const std::filesystem::path data_dir = std::filesystem::absolute(absl::GetFlag(FLAGS_data_dir), error);
  std::filesystem::create_directories(data_dir, error);
  if (error) return Fail("data_dir", absl::InternalError(error.message()));
  if (absl::Status ranges = CheckFlagRanges(); !ranges.ok()) return Fail("flags", ranges);
  absl::StatusOr<std::string> replica_id = ReplicaId();
  if (!replica_id.ok()) return Fail("flags", replica_id.status());
  absl::StatusOr<srv::JobManagerOptions> options = JobManagerOptionsFromFlags(data_dir, *replica_id);
  if (!options.ok()) return Fail("flags", options.status());
  if (absl::Status temp = UsePrivateTempDir(data_dir, *replica_id); !temp.ok()) return Fail("data_dir", temp);

  auto blobs = srv::BlobStore::Open(data_dir, absl::GetFlag(FLAGS_max_upload_bytes),
                                    absl::GetFlag(FLAGS_tenant_max_stored_bytes));
  if (!blobs.ok()) return Fail("blob store", blobs.status());
  srv::TenantBlobStores tenant_blobs(data_dir, blobs->get());
  auto auth = srv::Authenticator::Open(absl::GetFlag(FLAGS_auth_tokens_file));
  if (!auth.ok()) return Fail("auth_tokens_file", auth.status());
  const srv::pg::PoolOptions connections{absl::GetFlag(FLAGS_job_store_connections),
                                         std::chrono::seconds(absl::GetFlag(FLAGS_job_store_connection_max_age_seconds))};
  auto store = srv::OpenJobStore(absl::GetFlag(FLAGS_job_store), data_dir, connections);
  if (!store.ok()) return Fail("job store", store.status());
  srv::Metrics metrics;
  absl::StatusOr<int> metrics_port = metrics.Serve(absl::GetFlag(FLAGS_metrics_listen));
  if (!metrics_port.ok()) return Fail("metrics", metrics_port.status());
  if (::access(options->worker.binary.c_str(), X_OK) != 0) {
    return Fail("worker", absl::NotFoundError(absl::StrCat("cannot execute ", options->worker.binary.string())));
  }
  srv::JobManager jobs(*options, store->get(), &tenant_blobs, &metrics);
  if (absl::Status started = jobs.Start(); !started.ok()) return Fail("job manager", started);
  const Housekeeping housekeeping(tenant_blobs, jobs);

  srv::OptimizerService service(&tenant_blobs, store->get(), &jobs, &metrics, auth->get());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = srv::ServerCredentialsFromFiles(
      absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_client_ca));
  if (!credentials.ok()) return Fail("tls", credentials.status());
  int port = 0;
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartGrpc(&service, *credentials, &port);
  if (!server.ok()) return Fail("listen", server.status());
  srv::Log(srv::LogLevel::kInfo, Banner(*options, **store, **auth, port, *metrics_port));
  // The port file comes last: whoever waits for it finds the server serving and its banner logged.
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    absl::Status written = onnxopt::WriteFileAtomically(absl::GetFlag(FLAGS_port_file), std::to_string(port));
    if (!written.ok()) return Fail("port_file", written);
  }
  const int received = WaitForShutdown(signals, **auth);
  srv::Log(srv::LogLevel::kInfo, absl::StrCat(received == SIGTERM ? "SIGTERM" : "SIGINT", ", draining"));
  (*server)->GetHealthCheckService()->SetServingStatus(false);
  jobs.Drain(std::chrono::seconds(absl::GetFlag(FLAGS_drain_grace_seconds)));
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  srv::Log(srv::LogLevel::kInfo, absl::StrCat("stopped; ", jobs.queue_length(), " queued job(s) kept for the next start"));
  return 0;
}
