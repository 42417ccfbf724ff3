// The JobStore contract, run against both stores: the embedded SQLite one and PostgreSQL (a real,
// throwaway cluster: tests/postgres_cluster.h). Queue order, claims that never hand a job out twice
// (also from several store instances at once, as replicas do), leases, fencing, watching.
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/job_store.h"
#include "server/postgres_job_store.h"
#include "server/postgres_schema.h"
#include "server/sqlite_job_store.h"
#include "tests/postgres_cluster.h"

namespace onnxopt::server {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

// One cluster for the whole binary; a database per test.
testing::PostgresCluster& Cluster() {
  static std::unique_ptr<testing::PostgresCluster> cluster = [] {
    auto started = testing::PostgresCluster::Start(fs::temp_directory_path() /
                                                   absl::StrCat("onnxopt_pg_store_", ::getpid()));
    if (!started.ok()) {
      ADD_FAILURE() << started.status();
      std::abort();
    }
    return *std::move(started);
  }();
  return *cluster;
}

class JobStoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("onnxopt_store_", ::getpid(), "_", counter_++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (GetParam() == "postgresql") {
      database_ = absl::StrCat("store_test_", ::getpid(), "_", counter_);
      ASSERT_TRUE(Cluster().CreateDatabase(database_).ok());
    }
    store_ = Open();
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }
  // Another handle on the same jobs: another replica's, for PostgreSQL.
  std::unique_ptr<JobStore> Open() {
    auto store = OpenJobStore(GetParam() == "postgresql" ? Cluster().Uri(database_) : "sqlite", dir_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  std::string Queue(int priority, bool cuda = false, const std::string& request_id = "") {
    v1::Job job;
    job.set_request_id(request_id);
    job.mutable_config()->set_priority(priority);
    if (cuda) job.mutable_config()->mutable_benchmark()->set_device(v1::DEVICE_CUDA);
    bool created = false;
    auto stored = store_->Create(job, &created);
    EXPECT_TRUE(stored.ok() && created) << stored.status();
    return stored.ok() ? stored->name() : "";
  }
  std::string ClaimName(JobStore& store, const std::string& owner = "r1", WorkerDevice device = WorkerDevice::kAny,
                        seconds lease = seconds(30)) {
    auto claimed = store.Claim({owner, lease, device});
    EXPECT_TRUE(claimed.ok()) << claimed.status();
    return claimed.ok() && claimed->has_value() ? (*claimed)->name() : "";
  }

  static inline int counter_ = 0;
  fs::path dir_;
  std::string database_;
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreContractTest, ClaimsByPriorityThenFifoAndByDevice) {
  const std::string low = Queue(0), high = Queue(5), low2 = Queue(0), gpu = Queue(9, /*cuda=*/true);
  EXPECT_EQ(*store_->QueueLength(), 4);
  EXPECT_EQ(ClaimName(*store_, "cpu", WorkerDevice::kCpu), high) << "a CPU worker leaves the CUDA job";
  EXPECT_EQ(ClaimName(*store_, "gpu", WorkerDevice::kCuda), gpu);
  EXPECT_EQ(ClaimName(*store_, "gpu", WorkerDevice::kCuda), "") << "no other CUDA job";
  EXPECT_EQ(ClaimName(*store_), low);
  auto claimed = store_->Get(low);
  ASSERT_TRUE(claimed.ok());
  EXPECT_EQ(claimed->state(), v1::RUNNING);
  EXPECT_EQ(claimed->worker(), "r1");
  EXPECT_EQ(claimed->attempts(), 1);
  EXPECT_EQ(claimed->progress().phase(), v1::PHASE_LOADING);
  EXPECT_EQ(ClaimName(*store_), low2);
  EXPECT_EQ(ClaimName(*store_), "");
  EXPECT_EQ(*store_->QueueLength(), 0);
}

TEST_P(JobStoreContractTest, ConcurrentClaimersFromSeveralStoresGetEachJobOnce) {
  constexpr int kJobs = 60;
  std::set<std::string> queued;
  for (int i = 0; i < kJobs; ++i) queued.insert(Queue(i % 3));
  // Four claimers; for PostgreSQL each with a store of its own, like four replicas.
  std::vector<std::unique_ptr<JobStore>> replicas;
  for (int i = 0; i < 4; ++i) replicas.push_back(GetParam() == "postgresql" ? Open() : nullptr);
  std::mutex mutex;
  std::multiset<std::string> claimed;
  std::map<std::string, int> per_claimer;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      JobStore& store = replicas[i] ? *replicas[i] : *store_;
      const std::string owner = absl::StrCat("replica-", i);
      while (true) {
        auto job = store.Claim({owner, seconds(30), WorkerDevice::kAny});
        if (!job.ok() || !job->has_value()) break;
        std::lock_guard<std::mutex> lock(mutex);
        claimed.insert((*job)->name());
        ++per_claimer[owner];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(claimed.size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(std::set<std::string>(claimed.begin(), claimed.end()), queued) << "every job claimed exactly once";
  for (const std::string& name : queued) {
    auto job = store_->Get(name);
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->attempts(), 1);
    EXPECT_EQ(per_claimer.count(job->worker()), 1u);
  }
}

TEST_P(JobStoreContractTest, AnExpiredLeaseRequeuesThenFailsAfterMaxAttempts) {
  const std::string name = Queue(0);
  ASSERT_EQ(ClaimName(*store_, "dead", WorkerDevice::kAny, seconds(1)), name);
  EXPECT_TRUE(store_->RecoverExpiredLeases(2)->empty()) << "the lease still runs";
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  auto recovered = store_->RecoverExpiredLeases(2);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  ASSERT_EQ(recovered->size(), 1u);
  EXPECT_EQ((*recovered)[0].state(), v1::QUEUED);
  EXPECT_EQ((*recovered)[0].worker(), "");
  auto renewed = store_->RenewLease(name, "dead#1", seconds(30));
  ASSERT_TRUE(renewed.ok());
  EXPECT_FALSE(renewed->held) << "the dead replica's lease is gone";

  ASSERT_EQ(ClaimName(*store_, "second", WorkerDevice::kAny, seconds(1)), name);
  EXPECT_EQ(store_->Get(name)->attempts(), 2);
  // Renewing keeps it; then the second replica dies too.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ASSERT_TRUE(store_->RenewLease(name, "second#2", seconds(1))->held);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(store_->RecoverExpiredLeases(2)->empty()) << "renewed 0.6 s ago for 1 s";
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  recovered = store_->RecoverExpiredLeases(2);
  ASSERT_TRUE(recovered.ok());
  ASSERT_EQ(recovered->size(), 1u);
  const v1::Job failed = *store_->Get(name);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error().reason(), v1::ErrorReason::LEASE_EXPIRED);
  EXPECT_NE(failed.error().message().find("attempt 2 of 2"), std::string::npos) << failed.error().message();
  EXPECT_EQ(*store_->QueueLength(), 0);
}

TEST_P(JobStoreContractTest, OnlyTheLeaseHolderEndsAJob) {
  const std::string name = Queue(0);
  ASSERT_EQ(ClaimName(*store_, "old", WorkerDevice::kAny, seconds(1)), name);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_EQ(store_->RecoverExpiredLeases(3)->size(), 1u);
  ASSERT_EQ(ClaimName(*store_, "new"), name);
  // The old replica comes back and tries to store its result: fenced out.
  bool applied = true;
  auto stale = store_->Modify(
      name,
      [](v1::Job& job) {
        if (job.state() != v1::RUNNING || LeaseToken(job) != "old#1") return false;
        job.set_state(v1::SUCCEEDED);
        return true;
      },
      &applied);
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(applied);
  EXPECT_EQ(stale->state(), v1::RUNNING);
  EXPECT_EQ(stale->worker(), "new");
  auto lease = store_->RenewLease(name, "old#1", seconds(30));
  EXPECT_FALSE(lease->held);
  EXPECT_TRUE(store_->RenewLease(name, "new#2", seconds(30))->held);
}

TEST_P(JobStoreContractTest, CancelRequestsReachTheLeaseHolderAndWatchersSeeChanges) {
  const std::string name = Queue(0);
  ASSERT_EQ(ClaimName(*store_, "runner"), name);
  std::unique_ptr<JobStore> other = GetParam() == "postgresql" ? Open() : nullptr;
  JobStore& api = other ? *other : *store_;  // the replica the user talks to
  uint64_t version = 0;
  v1::Job seen;
  ASSERT_TRUE(api.WaitForChange(name, &version, std::chrono::steady_clock::now() + seconds(5), &seen));
  EXPECT_EQ(seen.state(), v1::RUNNING);
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (void)api.Update(name, [](v1::Job& job) { job.set_cancel_requested(true); });
  });
  ASSERT_TRUE(api.WaitForChange(name, &version, std::chrono::steady_clock::now() + seconds(5), &seen));
  canceller.join();
  EXPECT_TRUE(seen.cancel_requested());
  auto lease = store_->RenewLease(name, "runner#1", seconds(30));
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(lease->held);
  EXPECT_TRUE(lease->cancel_requested);
  EXPECT_FALSE(api.WaitForChange(name, &version, std::chrono::steady_clock::now() + std::chrono::milliseconds(300),
                                 &seen))
      << "nothing changed since";
}

TEST_P(JobStoreContractTest, RequestIdsPagesCacheHitsAndDeletes) {
  const std::string first = Queue(0, false, "req-1");
  bool created = true;
  v1::Job again;
  again.set_request_id("req-1");
  EXPECT_EQ(store_->Create(again, &created)->name(), first);
  EXPECT_FALSE(created);
  for (int i = 0; i < 4; ++i) Queue(0);
  auto page = store_->List(v1::JOB_STATE_UNSPECIFIED, 3, "");
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs.size(), 3u);
  auto rest = store_->List(v1::JOB_STATE_UNSPECIFIED, 3, page->next_page_token);
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->jobs.size(), 2u);
  EXPECT_EQ(rest->jobs.back().name(), first) << "newest first";
  EXPECT_FALSE(store_->List(v1::JOB_STATE_UNSPECIFIED, 3, page->next_page_token, std::string("t")).ok())
      << "a token works for its own listing only";
  // A cache hit comes named and ended: stored so, never queued.
  v1::Job hit;
  hit.set_name("jobs/cachehit0001");
  hit.set_state(v1::SUCCEEDED);
  hit.set_cache_key("key");
  ASSERT_TRUE(store_->Create(hit, &created).ok());
  EXPECT_TRUE(created);
  EXPECT_EQ(*store_->QueueLength(), 5);
  EXPECT_EQ(store_->FindSucceeded("", "key")->name(), "jobs/cachehit0001");
  EXPECT_EQ(store_->Create(hit, &created).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*store_->CountActive(""), 5);
  ASSERT_TRUE(store_->Delete(first).ok());
  EXPECT_EQ(store_->Delete(first).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store_->FindByRequestId("", "req-1").has_value());
  EXPECT_EQ(store_->All()->size(), 5u);
}

TEST_P(JobStoreContractTest, ALaterAttemptOfTheSameReplicaHoldsAnotherLease) {
  // A replica cut off from the database past its lease takes its own job back on reconnecting: the
  // attempt it was running must be fenced out like any other replica's.
  const std::string name = Queue(0);
  ASSERT_EQ(ClaimName(*store_, "same", WorkerDevice::kAny, seconds(1)), name);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_EQ(store_->RecoverExpiredLeases(3)->size(), 1u);
  ASSERT_EQ(ClaimName(*store_, "same"), name);
  EXPECT_FALSE(store_->RenewLease(name, "same#1", seconds(30))->held);
  EXPECT_TRUE(store_->RenewLease(name, "same#2", seconds(30))->held);
  EXPECT_EQ(LeaseToken(*store_->Get(name)), "same#2");
}

INSTANTIATE_TEST_SUITE_P(Stores, JobStoreContractTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

TEST(PostgresSchemaTest, MigratesOnceAndRefusesANewerSchema) {
  const std::string database = absl::StrCat("schema_test_", ::getpid());
  ASSERT_TRUE(Cluster().CreateDatabase(database).ok());
  ASSERT_TRUE(PostgresJobStore::Open(Cluster().Uri(database)).ok());
  ASSERT_TRUE(PostgresJobStore::Open(Cluster().Uri(database)).ok()) << "a second replica finds the schema in place";
  auto connection = pg::Connection::Open(Cluster().Uri(database));
  ASSERT_TRUE(connection.ok());
  auto versions = (*connection)->Exec("SELECT count(*), max(version) FROM onnxopt_schema_migrations");
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(versions->Int(0, 0), static_cast<int64_t>(PostgresMigrations().size()));
  ASSERT_TRUE((*connection)->Exec("INSERT INTO onnxopt_schema_migrations (version, description) VALUES (999, 'future')").ok());
  auto refused = PostgresJobStore::Open(Cluster().Uri(database));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("JOB_STORE_SCHEMA_NEWER"), std::string::npos);
}

TEST(PostgresSchemaTest, AnUnreachableDatabaseIsUnavailable) {
  auto store = OpenJobStore("postgresql://onnxopt@127.0.0.1:1/nothing?connect_timeout=2", "/nonexistent");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(store.status().message().find("JOB_STORE_UNAVAILABLE"), std::string::npos);
  EXPECT_EQ(OpenJobStore("mysql://x", "/tmp").status().code(), absl::StatusCode::kInvalidArgument);
}

// A connection past its age is closed when returned and, idle, by the sweep: what lets a smart shutdown of
// the database (which waits for every session to end) complete while replicas run.
TEST(PostgresPoolTest, ConnectionsAreClosedOnceTheyAreMaxAgeOldReturnedOrIdle) {
  const std::string database = absl::StrCat("pool_test_", ::getpid());
  ASSERT_TRUE(Cluster().CreateDatabase(database).ok());
  pg::Pool pool(Cluster().Uri(database), pg::PoolOptions{4, std::chrono::seconds(1)});
  auto backend = [&]() -> int64_t {
    auto lease = pool.Acquire();
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return -1;
    auto pid = (*lease)->Exec("SELECT pg_backend_pid()");
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? pid->Int(0, 0) : -1;
  };
  auto observer = pg::Connection::Open(Cluster().Uri(database));
  ASSERT_TRUE(observer.ok()) << observer.status();
  // The pool's sessions once they number `expected` (a closed backend leaves pg_stat_activity soon, not at once).
  auto pool_sessions = [&](int64_t expected) -> int64_t {
    int64_t sessions = -1;
    for (int tries = 0; tries < 30 && sessions != expected; ++tries) {
      if (tries > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto count = (*observer)->Exec(
          "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()");
      EXPECT_TRUE(count.ok()) << count.status();
      sessions = count.ok() ? count->Int(0, 0) : -1;
    }
    return sessions;
  };
  const int64_t first = backend();
  EXPECT_EQ(backend(), first) << "a young connection is reused";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const int64_t second = backend();
  EXPECT_NE(second, first) << "a connection past its age is not reused";
  EXPECT_EQ(pool_sessions(1), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));  // past its age, then a sweep (a quarter of it)
  EXPECT_EQ(pool_sessions(0), 0) << "the idle connection was closed without anyone asking the pool";
  EXPECT_GT(backend(), 0) << "and the pool opens another on need";
}

}  // namespace
}  // namespace onnxopt::server
