// Blob store, job store and queue on their own, against a temporary data folder.
#include <thread>

#include "gtest/gtest.h"
#include "optimizer/sha256.h"
#include "server/blob_store.h"
#include "server/job_manager.h"
#include "server/job_queue.h"
#include "server/job_store.h"

namespace onnxopt::server {
namespace {
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("onnxopt_server_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(BlobStoreTest, VerifiedUploadInChunksWithResume) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 1 << 20);
  ASSERT_TRUE(store.ok());
  const std::string data = "0123456789abcdefghij";
  const std::string digest = Sha256OfBytes(data);
  {
    auto upload = (*store)->BeginUpload(digest, static_cast<int64_t>(data.size()));
    ASSERT_TRUE(upload.ok());
    ASSERT_TRUE((*upload)->Append(0, data.substr(0, 8)).ok());
    // The connection drops here; the partial upload stays.
  }
  EXPECT_EQ((*store)->CommittedSize(digest), 8);
  EXPECT_FALSE((*store)->Exists(digest));
  auto resumed = (*store)->BeginUpload(digest, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ((*resumed)->Append(0, "01234567").code(), absl::StatusCode::kInvalidArgument) << "wrong offset";
  ASSERT_TRUE((*resumed)->Append(8, data.substr(8)).ok());
  ASSERT_TRUE((*resumed)->Finish().ok());
  EXPECT_TRUE((*store)->Exists(digest));
  EXPECT_EQ(*(*store)->SizeOf(digest), 20);
}

TEST(BlobStoreTest, ChecksumMismatchIsDataLossAndDiscardsTheUpload) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 1 << 20);
  const std::string claimed = Sha256OfBytes("what the client meant to send");
  auto upload = (*store)->BeginUpload(claimed, 5);
  ASSERT_TRUE((*upload)->Append(0, "12345").ok());
  absl::Status finished = (*upload)->Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(finished.message().find("CHECKSUM_MISMATCH"), std::string::npos);
  upload->reset();
  EXPECT_EQ((*store)->CommittedSize(claimed), 0);
  EXPECT_FALSE((*store)->Exists(claimed));
}

TEST(BlobStoreTest, RefusesBadDigestsOversizeDataAndConcurrentUploads) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 100);
  EXPECT_EQ((*store)->BeginUpload("ABC", 1).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string digest = Sha256OfBytes("x");
  EXPECT_NE((*store)->BeginUpload(digest, 1000).status().message().find("UPLOAD_TOO_LARGE"), std::string::npos);
  auto first = (*store)->BeginUpload(digest, 1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*store)->BeginUpload(digest, 1).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*first)->Append(0, "xy").code(), absl::StatusCode::kInvalidArgument) << "past the declared size";
}

v1::Job NewJob(const std::string& request_id = "") {
  v1::Job job;
  job.set_state(v1::QUEUED);
  job.set_request_id(request_id);
  return job;
}

TEST(JobStoreTest, PersistsAcrossReopenAndHonoursRequestIds) {
  TempDir dir;
  std::string name;
  {
    auto store = JobStore::Open(dir.path() / "jobs.sqlite3");
    ASSERT_TRUE(store.ok()) << store.status();
    bool created = false;
    auto job = (*store)->Create(NewJob("retry-me"), &created);
    ASSERT_TRUE(job.ok());
    EXPECT_TRUE(created);
    name = job->name();
    auto again = (*store)->Create(NewJob("retry-me"), &created);
    EXPECT_FALSE(created);
    EXPECT_EQ(again->name(), name);
    ASSERT_TRUE((*store)->Update(name, [](v1::Job& j) { j.set_state(v1::RUNNING); }).ok());
  }
  auto store = JobStore::Open(dir.path() / "jobs.sqlite3");
  ASSERT_TRUE(store.ok());
  auto job = (*store)->Get(name);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::RUNNING);
  EXPECT_EQ((*store)->Unfinished().size(), 1u);
  EXPECT_EQ((*store)->FindByRequestId("retry-me")->name(), name);
  EXPECT_EQ((*store)->Get("jobs/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobStoreTest, ListsNewestFirstWithPagesAndStateFilter) {
  TempDir dir;
  auto store = JobStore::Open(dir.path() / "jobs.sqlite3");
  std::vector<std::string> names;
  for (int i = 0; i < 5; ++i) {
    bool created;
    names.push_back((*store)->Create(NewJob(), &created)->name());
  }
  ASSERT_TRUE((*store)->Update(names[1], [](v1::Job& j) { j.set_state(v1::FAILED); }).ok());
  auto first = (*store)->List(v1::JOB_STATE_UNSPECIFIED, 2, "");
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->jobs.size(), 2u);
  EXPECT_EQ(first->jobs[0].name(), names[4]);
  auto second = (*store)->List(v1::JOB_STATE_UNSPECIFIED, 2, first->next_page_token);
  EXPECT_EQ(second->jobs[0].name(), names[2]);
  auto third = (*store)->List(v1::JOB_STATE_UNSPECIFIED, 2, second->next_page_token);
  EXPECT_EQ(third->jobs.size(), 1u);
  EXPECT_TRUE(third->next_page_token.empty());
  auto failed = (*store)->List(v1::FAILED, 10, "");
  ASSERT_EQ(failed->jobs.size(), 1u);
  EXPECT_EQ(failed->jobs[0].name(), names[1]);
  EXPECT_EQ((*store)->List(v1::FAILED, 10, "garbage").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobStoreTest, WatchersWakeOnChange) {
  TempDir dir;
  auto store = JobStore::Open(dir.path() / "jobs.sqlite3");
  bool created;
  const std::string name = (*store)->Create(NewJob(), &created)->name();
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)(*store)->Update(name, [](v1::Job& j) { j.set_state(v1::RUNNING); });
  });
  uint64_t version = 0;
  v1::Job job;
  EXPECT_TRUE((*store)->WaitForChange(name, &version, std::chrono::steady_clock::now() + std::chrono::seconds(10), &job));
  EXPECT_EQ(job.state(), v1::RUNNING);
  writer.join();
  EXPECT_FALSE((*store)->WaitForChange(name, &version, std::chrono::steady_clock::now() + std::chrono::milliseconds(20),
                                       &job));
}

TEST(JobQueueTest, PriorityThenFifoWithCapacityRemoveAndClose) {
  JobQueue queue(3);
  EXPECT_TRUE(queue.Push("a", 0));
  EXPECT_TRUE(queue.Push("b", 5));
  EXPECT_TRUE(queue.Push("c", 0));
  EXPECT_FALSE(queue.Push("d", 9)) << "full";
  EXPECT_TRUE(queue.Push("e", 0, /*force=*/true));
  EXPECT_TRUE(queue.Remove("c"));
  EXPECT_FALSE(queue.Remove("c"));
  EXPECT_EQ(*queue.Pop(), "b");
  EXPECT_EQ(*queue.Pop(), "a");
  EXPECT_EQ(*queue.Pop(), "e");
  queue.Push("f", 0);
  queue.Close();
  EXPECT_FALSE(queue.Pop().has_value()) << "closed queues hand out nothing; f stays for the next start";
}

TEST(JobManagerHelpersTest, SafeNamesAndReasons) {
  for (const char* good : {"weights.bin", "data/part-1.bin"}) EXPECT_TRUE(IsSafeRelativeName(good)) << good;
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a//b", "./x", "a\\b"}) {
    EXPECT_FALSE(IsSafeRelativeName(bad)) << bad;
  }
  EXPECT_EQ(SplitReason(absl::InvalidArgumentError("MODEL_PARSE_FAILED: nope")).first, "MODEL_PARSE_FAILED");
  EXPECT_EQ(SplitReason(absl::InvalidArgumentError("MODEL_PARSE_FAILED: nope")).second, "nope");
  EXPECT_EQ(SplitReason(absl::InternalError("disk: full")).first, "INTERNAL");
}

}  // namespace
}  // namespace onnxopt::server
