// Replicas on one PostgreSQL job store: tiny-job throughput with 1 and with 3 replicas, and how long a
// job takes to run again elsewhere after its replica is killed (SIGKILL). A throwaway postgresql-15
// cluster (tests/postgres_cluster.h), the real onnxopt-server binaries, the client library.
//
//   onnxopt-replicas-benchmark [--jobs=60] [--workers=2] [--lease=5] [--kills=3]
//
// Also the queue's own ceiling: jobs created, claimed and ended through PostgresJobStore alone, by 1 and
// by 3 claimers with connections of their own (as replicas), without running anything.
//
// Both throughput runs use the same jobs, workers per replica and submission pattern (round robin over
// the replicas); the ratio is measured side by side in one run.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "server/job_store.h"
#include "tests/e2e_harness.h"
#include "tests/postgres_cluster.h"
#include "tests/replica_deployment.h"

namespace onnxopt::testing {
namespace {

using client::Client;

constexpr char kTinyJob[] = R"({"cache": false, "validation": {"skip": true}, "benchmark": {"skip": true}})";
constexpr char kSlowJob[] =
    R"({"cache": false, "benchmark": {"time_budget_seconds": 3, "stability": 1e-9, "warmup_runs": 1}})";

bool Ended(const v1::Job& job) {
  return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED || job.state() == v1::CANCELLED;
}

// What every replica here runs with besides its role.
std::vector<std::string> ReplicaFlags(int lease) {
  return {absl::StrCat("--lease_seconds=", lease), "--poll_interval_ms=100", "--drain_grace_seconds=0",
          "--queue_capacity=10000"};
}

// Starts a replica; its address, or "" after saying why it did not start.
std::string Start(ReplicaDeployment& deployment, const std::string& name, const std::vector<std::string>& flags) {
  const std::string address = deployment.Start(name, flags);
  if (address.empty()) std::fprintf(stderr, "%s did not start: %s\n", name.c_str(), deployment.Log(name).c_str());
  return address;
}

// Polls until every job ended; false on timeout.
bool WaitAll(Client& client, const std::vector<std::string>& jobs, std::chrono::seconds timeout,
             std::map<std::string, int>* per_worker = nullptr) {
  const auto deadline = Clock::now() + timeout;
  for (const std::string& name : jobs) {
    while (true) {
      auto job = client.GetJob(name);
      if (job.ok() && Ended(*job)) {
        if (job->state() != v1::SUCCEEDED) std::fprintf(stderr, "%s: %s\n", name.c_str(), job->ShortDebugString().c_str());
        if (per_worker != nullptr) ++(*per_worker)[job->worker()];
        break;
      }
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return true;
}

// Jobs per second for `replicas` replicas (role all, `workers` each) on a fresh database.
double Throughput(PostgresCluster& cluster, const fs::path& dir, int replicas, int workers, int jobs) {
  const std::string database = absl::StrCat("throughput_", replicas);
  if (!cluster.CreateDatabase(database).ok()) return 0;
  ReplicaDeployment deployment(dir / database, cluster.Uri(database), ReplicaFlags(30));
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < replicas; ++i) {
    const std::string address = Start(deployment, absl::StrCat("replica-", i), {absl::StrCat("--workers=", workers)});
    if (address.empty()) return 0;
    clients.push_back(std::make_unique<Client>(address));
  }
  auto model = clients[0]->UploadModel(FixturePath("cnn_tiny.onnx"));
  auto config = client::ParseConfigJson(kTinyJob);
  if (!model.ok() || !config.ok()) return 0;
  const auto start = Clock::now();
  std::vector<std::string> names;
  for (int i = 0; i < jobs; ++i) {
    auto job = clients[i % replicas]->CreateJob(*model, *config);
    if (!job.ok()) {
      std::fprintf(stderr, "CreateJob: %s\n", job.status().ToString().c_str());
      return 0;
    }
    names.push_back(job->name());
  }
  std::map<std::string, int> per_worker;
  if (!WaitAll(*clients[0], names, std::chrono::seconds(600), &per_worker)) return 0;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("  %d replica(s) x %d workers: %d jobs in %.2f s = %.2f jobs/s; jobs per replica:", replicas, workers,
              jobs, seconds, jobs / seconds);
  for (const auto& [worker, count] : per_worker) std::printf(" %s %d", worker.c_str(), count);
  std::printf("\n");
  return jobs / seconds;
}

// Jobs per second the store dispatches: `jobs` created, then claimed and ended by `claimers` threads,
// each with a store (connections) of its own.
double Dispatch(PostgresCluster& cluster, int claimers, int jobs) {
  const std::string database = absl::StrCat("dispatch_", claimers);
  if (!cluster.CreateDatabase(database).ok()) return 0;
  std::vector<std::unique_ptr<server::JobStore>> stores;
  for (int i = 0; i < claimers; ++i) {
    auto store = server::OpenJobStore(cluster.Uri(database), "/nonexistent");
    if (!store.ok()) return 0;
    stores.push_back(*std::move(store));
  }
  for (int i = 0; i < jobs; ++i) {
    v1::Job job;
    job.mutable_config()->set_priority(i % 3);
    bool created = false;
    if (!stores[0]->Create(job, &created).ok()) return 0;
  }
  std::atomic<int> done{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < claimers; ++i) {
    threads.emplace_back([&, i] {
      const std::string owner = absl::StrCat("claimer-", i);
      while (true) {
        auto claimed = stores[i]->Claim({owner, std::chrono::seconds(30), server::WorkerDevice::kAny});
        if (!claimed.ok() || !claimed->has_value()) return;
        (void)stores[i]->Update((*claimed)->name(), [](v1::Job& job) { job.set_state(v1::SUCCEEDED); });
        ++done;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("  %d claimer(s): %d jobs claimed and ended in %.2f s = %.0f jobs/s\n", claimers, done.load(), seconds,
              done.load() / seconds);
  return done.load() == jobs ? done.load() / seconds : 0;
}

// Seconds from killing the replica running a job to the job running again elsewhere and to its end.
bool Recovery(PostgresCluster& cluster, const fs::path& dir, int lease, int round, double* rerun, double* finished) {
  const std::string database = absl::StrCat("recovery_", round);
  if (!cluster.CreateDatabase(database).ok()) return false;
  ReplicaDeployment deployment(dir / database, cluster.Uri(database), ReplicaFlags(lease));
  Client api(Start(deployment, "api", {"--role=api"}));
  if (Start(deployment, "doomed", {"--role=worker", "--workers=1"}).empty()) return false;
  auto model = api.UploadModel(FixturePath("bert_tiny.onnx"));
  auto config = client::ParseConfigJson(kSlowJob);
  if (!model.ok() || !config.ok()) return false;
  auto job = api.CreateJob(*model, *config);
  if (!job.ok()) return false;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    auto seen = api.GetJob(job->name());
    if (seen.ok() && seen->state() == v1::RUNNING && seen->progress().phase() == v1::PHASE_BENCHMARKING) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (Start(deployment, "survivor", {"--role=worker", "--workers=1"}).empty()) return false;
  const auto killed = Clock::now();
  deployment.Kill("doomed");
  bool moved = false;
  while (Clock::now() < killed + std::chrono::seconds(120)) {
    auto seen = api.GetJob(job->name());
    if (seen.ok() && !moved && seen->worker() == "survivor") {
      *rerun = std::chrono::duration<double>(Clock::now() - killed).count();
      moved = true;
    }
    if (seen.ok() && Ended(*seen)) {
      *finished = std::chrono::duration<double>(Clock::now() - killed).count();
      return moved && seen->state() == v1::SUCCEEDED && seen->attempts() == 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int Main(int argc, char** argv) {
  int jobs = 60, workers = 2, lease = 5, kills = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag, int* out) {
      const std::string prefix = absl::StrCat(flag, "=");
      return arg.rfind(prefix, 0) == 0 && absl::SimpleAtoi(arg.substr(prefix.size()), out) && *out > 0;
    };
    if (!value("--jobs", &jobs) && !value("--workers", &workers) && !value("--lease", &lease) &&
        !value("--kills", &kills)) {
      std::fprintf(stderr, "usage: onnxopt-replicas-benchmark [--jobs=60] [--workers=2] [--lease=5] [--kills=3]\n");
      return 2;
    }
  }
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("onnxopt_replicas_bench_", ::getpid());
  auto cluster = PostgresCluster::Start(dir / "pg");
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.status().ToString().c_str());
    return 1;
  }
  std::printf("Tiny-job throughput (cnn_tiny.onnx, validation and benchmark skipped, cache off), one PostgreSQL:\n");
  const double one = Throughput(**cluster, dir, 1, workers, jobs);
  const double three = Throughput(**cluster, dir, 3, workers, jobs);
  if (one <= 0 || three <= 0) return 1;
  std::printf("  3 replicas / 1 replica: %.2fx (this machine has %u cores, shared by all replicas)\n", three / one,
              std::thread::hardware_concurrency());
  std::printf("The queue alone (PostgresJobStore: claim with SKIP LOCKED, then end; nothing run):\n");
  const double one_claimer = Dispatch(**cluster, 1, 2000);
  const double three_claimers = Dispatch(**cluster, 3, 2000);
  if (one_claimer <= 0 || three_claimers <= 0) return 1;
  std::printf("  3 claimers / 1 claimer: %.2fx\n", three_claimers / one_claimer);
  std::printf("Recovery after SIGKILL of the replica running a job (--lease_seconds=%d; expired leases are looked for "
              "every %.2f s):\n", lease, std::clamp(lease / 6.0, 0.1, 5.0));
  int failures = 0;
  for (int round = 0; round < kills; ++round) {
    double rerun = 0, finished = 0;
    if (!Recovery(**cluster, dir, lease, round, &rerun, &finished)) {
      std::printf("  round %d: the job did not recover\n", round);
      ++failures;
      continue;
    }
    std::printf("  round %d: running again after %.2f s, succeeded after %.2f s\n", round, rerun, finished);
  }
  cluster->reset();
  fs::remove_all(dir);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace onnxopt::testing

int main(int argc, char** argv) { return onnxopt::testing::Main(argc, argv); }
