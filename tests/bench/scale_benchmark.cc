// A long queue: how fast a replica takes 10,000 jobs, how fast it lists and reads them with that many
// there, and whether its memory grows with the jobs the store holds. Figures in docs/reliability.md.
//   --store=postgresql (default): one API replica (--role=api: nothing runs, every job stays queued) on a
//     throwaway postgresql-15 cluster (tests/postgres_cluster.h);
//   --store=sqlite: one replica with two workers on SQLite, which run the jobs as they come: also the
//     time the two workers take to drain the queue, and the replica's memory after 100, 1,000 and 5,000
//     finished jobs.
//
//   onnxopt-scale-benchmark [--jobs=10000] [--threads=4] [--store=postgresql|sqlite]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/e2e_harness.h"
#include "tests/postgres_cluster.h"
#include "tests/replica_deployment.h"

namespace onnxopt::testing {
namespace {

using client::Client;

constexpr char kTinyJob[] = R"({"cache": false, "validation": {"skip": true}, "benchmark": {"skip": true}})";

// The resident memory of process `pid`, in MiB (VmRSS), or -1.
double ResidentMiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (line.rfind("VmRSS:", 0) == 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 9)), &kib)) {
      return kib / 1024.0;
    }
  }
  return -1;
}

// Milliseconds at the given quantile of `samples` (sorted here).
double Quantile(std::vector<double> samples, double q) {
  std::sort(samples.begin(), samples.end());
  return samples.empty() ? 0 : samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))];
}

template <typename Call>
std::vector<double> TimeCalls(int count, Call call) {
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    const auto start = Clock::now();
    if (!call(i)) return {};
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return ms;
}

// Whether every job of `names` up to `count` has ended (they run in the order they were queued).
bool FinishedUpTo(Client& client, const std::vector<std::string>& names, int count) {
  for (int i = count - 1; i >= 0; --i) {
    if (names[i].empty()) continue;
    auto job = client.GetJob(names[i]);
    return job.ok() && (job->state() == v1::SUCCEEDED || job->state() == v1::FAILED);
  }
  return true;
}

// SQLite: waits for the workers to end every job, printing the replica's memory after 100, 1,000 and
// 5,000 finished ones; the seconds from the end of the submissions to the last job's end.
double Drain(Client& client, const std::vector<std::string>& names, pid_t replica) {
  const auto start = Clock::now();
  for (int mark : {100, 1000, 5000, static_cast<int>(names.size())}) {
    if (mark > static_cast<int>(names.size())) continue;
    while (!FinishedUpTo(client, names, mark)) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::printf("  after %5d finished jobs: RSS %.1f MiB\n", mark, ResidentMiB(replica));
    if (mark == static_cast<int>(names.size())) break;
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int Run(int jobs, int threads, bool sqlite, const std::string& job_store, const fs::path& dir) {
  int failures = 0;
  {
    ReplicaDeployment deployment(dir / "replicas", job_store,
                                 {"--drain-grace-seconds=0", absl::StrCat("--queue-capacity=", jobs + 100)});
    const std::string address =
        deployment.Start("api", sqlite ? std::vector<std::string>{"--workers=2"} : std::vector<std::string>{"--role=api"});
    if (address.empty()) {
      std::fprintf(stderr, "the replica did not start: %s\n", deployment.Log("api").c_str());
      return 1;
    }
    Client api(address);
    auto model = api.UploadModel(FixturePath("cnn_tiny.onnx"));
    auto config = client::ParseConfigJson(kTinyJob);
    if (!model.ok() || !config.ok()) return 1;
    std::printf(sqlite ? "%d jobs on SQLite through one replica with two workers running them, %d client threads:\n"
                       : "%d jobs queued on PostgreSQL through one API replica (--role=api), %d client threads:\n",
                jobs, threads);
    std::printf("  API replica's RSS: %.1f MiB before the first job\n", ResidentMiB(deployment.Pid("api")));
    // Submitted in stages, the replica's memory read after each.
    std::vector<std::string> names(jobs);
    std::atomic<int> failed{0};
    int done = 0;
    double submit_seconds = 0;
    for (int stage_end : {std::min(100, jobs), std::min(1000, jobs), std::min(5000, jobs), jobs}) {
      if (stage_end <= done) continue;
      const auto start = Clock::now();
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t, from = done] {
          Client client(address);
          for (int i = from + t; i < stage_end; i += threads) {
            v1::CreateJobRequest request;
            *request.mutable_model() = *model;
            *request.mutable_config() = *config;
            request.set_request_id(absl::StrCat("scale-", i));
            (*request.mutable_labels())["team"] = i % 2 == 0 ? "a" : "b";
            (*request.mutable_labels())["batch"] = std::to_string(i / 1000);
            auto job = client.CreateJob(request);
            if (job.ok()) {
              names[i] = job->name();
            } else if (failed++ == 0) {
              std::fprintf(stderr, "CreateJob: %s\n", job.status().ToString().c_str());
            }
          }
        });
      }
      for (auto& thread : pool) thread.join();
      submit_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      done = stage_end;
      std::printf("  after %5d jobs: RSS %.1f MiB\n", done, ResidentMiB(deployment.Pid("api")));
    }
    std::printf("  submitted at %.0f jobs/s (each CreateJob parses the model in a worker process); %d failed\n",
                jobs / submit_seconds, failed.load());
    failures += failed.load();
    // Listing and reading with the whole queue there.
    std::string token;
    std::vector<double> first_pages = TimeCalls(200, [&](int) { return api.ListJobs(v1::JOB_STATE_UNSPECIFIED, 50, "").ok(); });
    std::vector<double> filtered = TimeCalls(200, [&](int) { return api.ListJobs(v1::JOB_STATE_UNSPECIFIED, 50, "", {{"team", "a"}}).ok(); });
    std::vector<double> deep = TimeCalls(std::min(200, jobs / 50), [&](int) {
      auto page = api.ListJobs(v1::QUEUED, 50, token);
      if (page.ok()) token = page->next_page_token();
      return page.ok();
    });
    std::mt19937 random(1);
    std::vector<double> gets = TimeCalls(1000, [&](int) { return api.GetJob(names[random() % names.size()]).ok(); });
    if (first_pages.empty() || filtered.empty() || deep.empty() || gets.empty()) {
      std::fprintf(stderr, "a ListJobs or GetJob call failed\n");
      return 1;
    }
    std::printf("  ListJobs, page of 50: p50 %.1f ms, p99 %.1f ms (first page); with a label filter p50 %.1f ms, "
                "p99 %.1f ms; paging through QUEUED p50 %.1f ms, p99 %.1f ms (%zu pages)\n",
                Quantile(first_pages, 0.5), Quantile(first_pages, 0.99), Quantile(filtered, 0.5),
                Quantile(filtered, 0.99), Quantile(deep, 0.5), Quantile(deep, 0.99), deep.size());
    std::printf("  GetJob: p50 %.2f ms, p99 %.2f ms (1000 random jobs)\n", Quantile(gets, 0.5), Quantile(gets, 0.99));
    if (sqlite) {
      const double seconds = Drain(api, names, deployment.Pid("api"));
      std::printf("  two workers ended the rest %.0f s after the last submission (%.1f jobs/s overall)\n", seconds,
                  jobs / (submit_seconds + seconds));
    }
  }
  return failures == 0 ? 0 : 1;
}

int Main(int argc, char** argv) {
  int jobs = 10000, threads = 4;
  std::string store = "postgresql";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag, int* out) {
      const std::string prefix = absl::StrCat(flag, "=");
      return arg.rfind(prefix, 0) == 0 && absl::SimpleAtoi(arg.substr(prefix.size()), out) && *out > 0;
    };
    if (arg == "--store=sqlite" || arg == "--store=postgresql") {
      store = arg.substr(8);
    } else if (!value("--jobs", &jobs) && !value("--threads", &threads)) {
      std::fprintf(stderr, "usage: onnxopt-scale-benchmark [--jobs=10000] [--threads=4] [--store=postgresql|sqlite]\n");
      return 2;
    }
  }
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("onnxopt_scale_bench_", ::getpid());
  if (store == "sqlite") {
    const int result = Run(jobs, threads, /*sqlite=*/true, "sqlite", dir);
    fs::remove_all(dir);
    return result;
  }
  auto cluster = PostgresCluster::Start(dir / "pg");
  if (!cluster.ok() || !(*cluster)->CreateDatabase("scale").ok()) {
    std::fprintf(stderr, "no PostgreSQL cluster: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  const int result = Run(jobs, threads, /*sqlite=*/false, (*cluster)->Uri("scale"), dir);
  cluster->reset();
  fs::remove_all(dir);
  return result;
}

}  // namespace
}  // namespace onnxopt::testing

int main(int argc, char** argv) { return onnxopt::testing::Main(argc, argv); }
