// Several real onnxopt-server replicas on one PostgreSQL job store (a throwaway cluster) and one shared
// data folder: API replicas take jobs, worker replicas run them, a replica killed with SIGKILL loses
// its job to another once the lease expires, and cancel and watch work from any replica.
#include <csignal>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "grpcpp/create_channel.h"
#include "onnxopt/v1/service.grpc.pb.h"
#include "optimizer/sha256.h"
#include "tests/e2e_harness.h"
#include "tests/postgres_cluster.h"
#include "tests/replica_deployment.h"

namespace onnxopt::testing {
namespace {

using client::Client;

bool IsTerminalForTest(const v1::Job& job) {
  return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED || job.state() == v1::CANCELLED;
}

class ReplicasTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = PostgresCluster::Start(fs::temp_directory_path() / absl::StrCat("onnxopt_pg_replicas_", ::getpid()));
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(*started).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    dir_ = fs::temp_directory_path() / ("onnxopt_replicas_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string database = absl::StrCat("replicas_", ++databases_);
    ASSERT_TRUE(cluster_->CreateDatabase(database).ok());
    uri_ = cluster_->Uri(database);
  }
  void TearDown() override {
    replicas_.reset();  // SIGTERM to every replica still running
    fs::remove_all(dir_);
  }

  // A replica on the shared store and data folder, named `name` (its --replica-id).
  void StartReplica(const std::string& name, const std::vector<std::string>& flags) {
    if (!replicas_) {
      replicas_ = std::make_unique<ReplicaDeployment>(
          dir_, uri_,
          std::vector<std::string>{"--lease-seconds=3", "--poll-interval-ms=100", "--drain-grace-seconds=0",
                                   "--job-store-connections=2"});  // the smallest pool: nothing may need more
    }
    ASSERT_FALSE(replicas_->Start(name, flags).empty()) << replicas_->Log(name);
  }
  std::string Address(const std::string& name) { return replicas_->Address(name); }
  void Kill(const std::string& name) { replicas_->Kill(name); }

  // Uploads `model` through `client` and creates a job with the config `json`.
  std::string Submit(Client& client, const fs::path& model, const std::string& json) {
    auto uploaded = client.UploadModel(model);
    EXPECT_TRUE(uploaded.ok()) << uploaded.status();
    auto config = client::ParseConfigJson(json);
    EXPECT_TRUE(config.ok()) << config.status();
    auto job = client.CreateJob(*uploaded, *config);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->name() : "";
  }
  // Polls until `done` holds for the job (bounded).
  v1::Job WaitUntil(Client& client, const std::string& name, const std::function<bool(const v1::Job&)>& done,
                    std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto deadline = Clock::now() + timeout;
    v1::Job job;
    while (Clock::now() < deadline) {
      auto got = client.GetJob(name);
      if (got.ok()) {
        job = *got;
        if (done(job)) return job;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "timed out waiting for " << name << ", last seen " << job.ShortDebugString();
    return job;
  }
  std::string Log(const std::string& name) { return replicas_->Log(name); }

  static inline PostgresCluster* cluster_ = nullptr;
  static inline int databases_ = 0;
  fs::path dir_;
  std::string uri_;
  std::unique_ptr<ReplicaDeployment> replicas_;
};

// Tiny jobs: validation and benchmark skipped, no cache (each job runs).
constexpr char kTinyJob[] = R"({"cache": false, "validation": {"skip": true}, "benchmark": {"skip": true}})";
// A job that benchmarks for about four seconds.
constexpr char kSlowJob[] =
    R"({"cache": false, "benchmark": {"time_budget_seconds": 4, "stability": 1e-9, "warmup_runs": 1}})";

TEST_F(ReplicasTest, JobsSubmittedToTheApiRunOnSeveralWorkers) {
  StartReplica("api", {"--role=api"});
  StartReplica("worker-a", {"--role=worker", "--workers=1"});
  StartReplica("worker-b", {"--role=worker", "--workers=1"});
  Client api(Address("api"));
  std::vector<std::string> jobs;
  for (int i = 0; i < 8; ++i) jobs.push_back(Submit(api, FixturePath("cnn_tiny.onnx"), kTinyJob));
  std::map<std::string, int> per_worker;
  for (const std::string& name : jobs) {
    const v1::Job job = WaitUntil(api, name, [](const v1::Job& j) { return IsTerminalForTest(j); });
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << job.ShortDebugString();
    EXPECT_EQ(job.attempts(), 1);
    ++per_worker[job.worker()];
  }
  EXPECT_EQ(per_worker.size(), 2u) << "both workers ran jobs; " << per_worker.begin()->first << " ran them all";
  EXPECT_EQ(per_worker.count("api"), 0u) << "the API replica runs no jobs";
  // A worker's result, written to the shared folder, downloads through the API replica.
  const fs::path out = dir_ / "result.onnx";
  ASSERT_TRUE(api.Download(jobs[0], "model.onnx", out).ok());
  EXPECT_GT(fs::file_size(out), 0u);
  // Workers serve health, not the API.
  Client worker(Address("worker-a"));
  EXPECT_EQ(worker.GetJob(jobs[0]).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(HealthStatus(Address("worker-a"), ""), 1);
  EXPECT_EQ(HealthStatus(Address("api"), "onnxopt.v1.Optimizer"), 1);
  auto info = api.GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->replica_id(), "api");
  EXPECT_EQ(info->role(), "api");
  EXPECT_EQ(info->job_store(), "postgresql");
  EXPECT_EQ(info->workers(), 0);
  // The CLI against the API replica names the worker.
  const pid_t cli = Spawn({ONNXOPT_CLI_BIN, "--server", Address("api"), "status", jobs[0]}, dir_ / "cli.out",
                          dir_ / "cli.err");
  ASSERT_EQ(WaitFor(cli, std::chrono::seconds(60)), 0) << Slurp(dir_ / "cli.err");
  EXPECT_NE(Slurp(dir_ / "cli.out").find("worker   worker-"), std::string::npos) << Slurp(dir_ / "cli.out");
}

TEST_F(ReplicasTest, AKilledWorkersJobFinishesOnAnotherAfterItsLeaseExpires) {
  StartReplica("api", {"--role=api"});
  StartReplica("doomed", {"--role=worker", "--workers=1"});
  Client api(Address("api"));
  const std::string name = Submit(api, FixturePath("bert_tiny.onnx"), kSlowJob);
  WaitUntil(api, name, [](const v1::Job& j) { return j.state() == v1::RUNNING && j.worker() == "doomed"; });
  StartReplica("survivor", {"--role=worker", "--workers=1", "--metrics-listen=127.0.0.1:0"});
  const auto killed = Clock::now();
  Kill("doomed");
  const v1::Job taken = WaitUntil(api, name, [](const v1::Job& j) { return j.worker() == "survivor"; });
  const double recovery = std::chrono::duration<double>(Clock::now() - killed).count();
  EXPECT_EQ(taken.attempts(), 2);
  // The lease is 3 s; the survivor looks for expired leases every 0.5 s (some slack for a busy machine).
  EXPECT_LT(recovery, 3 + 0.5 + 3) << "seconds from the kill to the job running elsewhere";
  std::cout << "recovery: the job ran again " << recovery << " s after its replica was killed" << std::endl;
  const v1::Job done = WaitUntil(api, name, [](const v1::Job& j) { return IsTerminalForTest(j); });
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.ShortDebugString() << "\n" << Log("survivor");
  EXPECT_EQ(done.worker(), "survivor");
  EXPECT_EQ(done.attempts(), 2);
  const std::string banner = Slurp(dir_ / "survivor.out");
  const size_t at = banner.find("metrics on port ");
  ASSERT_NE(at, std::string::npos) << banner;
  EXPECT_NE(ScrapeMetrics(std::stoi(banner.substr(at + 16))).find(
                "onnxopt_job_lease_expirations_total{outcome=\"requeued\"} 1"),
            std::string::npos);
  // Only the survivor's attempt was published; the dead replica's leftovers are gone.
  auto report = api.GetReport(name);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->benchmark().speedup() > 0);
  const fs::path job_dir = replicas_->data_dir() / "jobs" / name.substr(5);
  EXPECT_TRUE(fs::exists(job_dir / "worker.log")) << "the attempt that counted keeps its log";
  for (const auto& entry : fs::directory_iterator(job_dir)) {
    EXPECT_EQ(entry.path().filename().string().rfind("attempt-", 0), std::string::npos) << entry.path();
  }
}

TEST_F(ReplicasTest, CancelAndWatchWorkFromAnyReplica) {
  StartReplica("api-1", {"--role=api"});
  StartReplica("api-2", {"--role=api"});
  StartReplica("runner", {"--role=all", "--workers=1"});
  Client first(Address("api-1")), second(Address("api-2"));
  const std::string name = Submit(first, FixturePath("bert_tiny.onnx"),
                                  R"({"cache": false, "benchmark": {"time_budget_seconds": 120, "stability": 1e-9}})");
  WaitUntil(second, name, [](const v1::Job& j) { return j.state() == v1::RUNNING; });
  std::vector<v1::JobState> seen;
  std::thread watcher([&] {
    auto final_job = second.WatchJob(name, [&](const v1::Job& job) { seen.push_back(job.state()); });
    EXPECT_TRUE(final_job.ok()) << final_job.status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto asked = Clock::now();
  auto cancelled = first.CancelJob(name);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  watcher.join();
  const double took = std::chrono::duration<double>(Clock::now() - asked).count();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), v1::CANCELLED);
  EXPECT_LT(took, 15) << "seconds from CancelJob on one replica to the watcher on another seeing it end";
  EXPECT_EQ(second.GetJob(name)->state(), v1::CANCELLED);
}

TEST_F(ReplicasTest, AnUploadResumesOnAnotherReplicaButNeverOnTwoAtOnce) {
  StartReplica("api-1", {"--role=api"});
  StartReplica("api-2", {"--role=api"});
  auto first = v1::Optimizer::NewStub(grpc::CreateChannel(Address("api-1"), grpc::InsecureChannelCredentials()));
  auto second =
      v1::Optimizer::NewStub(grpc::CreateChannel(Address("api-2"), grpc::InsecureChannelCredentials()));
  const std::string bytes = Slurp(FixturePath("cnn_tiny.onnx"));
  const std::string digest = *Sha256OfFile(FixturePath("cnn_tiny.onnx"));
  const int64_t half = static_cast<int64_t>(bytes.size() / 2);
  auto chunk = [&](const std::string& session, int64_t offset, int64_t length) {
    v1::UploadBlobRequest request;
    request.set_sha256(digest);
    request.set_total_size(static_cast<int64_t>(bytes.size()));
    request.set_upload_id(session);
    request.set_offset(offset);
    request.set_data(bytes.substr(static_cast<size_t>(offset), static_cast<size_t>(length)));
    return request;
  };
  {  // The first half on one replica, then the client goes away.
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = first->UploadBlob(&context, &blob);
    ASSERT_TRUE(writer->Write(chunk("session-1", 0, half)));
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  // While a session writes on one replica, the same session is refused on the other.
  grpc::ClientContext held_context;
  v1::Blob held_blob;
  auto held = first->UploadBlob(&held_context, &held_blob);
  ASSERT_TRUE(held->Write(chunk("session-2", 0, 1024)));
  auto committed = [&](v1::Optimizer::Stub& stub, const std::string& session) {
    v1::GetUploadStatusRequest request;
    request.set_sha256(digest);
    request.set_upload_id(session);
    v1::UploadStatus status;
    grpc::ClientContext context;
    return stub.GetUploadStatus(&context, request, &status).ok() ? status.committed_size() : -1;
  };
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (committed(*second, "session-2") != 1024 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = second->UploadBlob(&context, &blob);
    writer->Write(chunk("session-2", 1024, 1024));
    writer->WritesDone();
    const grpc::Status refused = writer->Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::ABORTED) << refused.error_message();
    EXPECT_NE(refused.error_message().find("UPLOAD_IN_PROGRESS"), std::string::npos) << refused.error_message();
  }
  held_context.TryCancel();
  held->Finish();
  // The other replica sees the first session's half and finishes it.
  EXPECT_EQ(committed(*second, "session-1"), half);
  {
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = second->UploadBlob(&context, &blob);
    v1::UploadBlobRequest last = chunk("session-1", half, static_cast<int64_t>(bytes.size()) - half);
    last.set_finish_write(true);
    ASSERT_TRUE(writer->Write(last));
    writer->WritesDone();
    const grpc::Status finished = writer->Finish();
    ASSERT_TRUE(finished.ok()) << finished.error_message();
  }
  EXPECT_EQ(committed(*first, "session-1"), static_cast<int64_t>(bytes.size())) << "the blob is there for both";
  EXPECT_EQ(*Sha256OfFile(replicas_->data_dir() / "blobs" / digest), digest);
}

TEST_F(ReplicasTest, SplitRolesNeedASharedStore) {
  const pid_t pid = Spawn({ONNXOPT_SERVER_BIN, "--role=worker", "--listen=127.0.0.1:0", "--metrics-listen=",
                           absl::StrCat("--data-dir=", (dir_ / "alone").string())},
                          dir_ / "alone.out", dir_ / "alone.err");
  EXPECT_EQ(WaitFor(pid, std::chrono::seconds(30)), 1);
  EXPECT_NE(Slurp(dir_ / "alone.err").find("needs a job store other replicas share"), std::string::npos)
      << Slurp(dir_ / "alone.err");
}

}  // namespace
}  // namespace onnxopt::testing
