// Blob store, job store and queue on their own, against a temporary data folder.
#include <sqlite3.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/failure.h"
#include "optimizer/sha256.h"
#include "server/blob_store.h"
#include "server/job_manager.h"
#include "server/job_process.h"
#include "server/sqlite_job_store.h"
#include "server/tenants.h"
#include "server/worker_protocol.h"

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

// A record written before artifacts had roles reads back with them, so clients place its files alike.
TEST(JobStoreTest, RecordsOfEarlierVersionsGetTheirArtifactsRoles) {
  v1::Job job;
  for (const char* name : {"model.onnx", "model.onnx.data", "report.json", "ort_session.json", "extra.bin"}) {
    job.mutable_result()->add_artifacts()->set_name(name);
  }
  job.mutable_result()->mutable_artifacts(4)->set_role(v1::ARTIFACT_REPORT);  // a role given is kept
  UpgradeRecord(job);
  const auto& artifacts = job.result().artifacts();
  EXPECT_EQ(artifacts[0].role(), v1::ARTIFACT_MODEL);
  EXPECT_EQ(artifacts[1].role(), v1::ARTIFACT_MODEL_DATA);
  EXPECT_EQ(artifacts[2].role(), v1::ARTIFACT_REPORT);
  EXPECT_EQ(artifacts[3].role(), v1::ARTIFACT_SESSION_SETTINGS);
  EXPECT_EQ(artifacts[4].role(), v1::ARTIFACT_REPORT);
  // A failed job's error stays (result and error are a oneof).
  v1::Job failed;
  failed.mutable_error()->set_reason(v1::ErrorReason::LEASE_EXPIRED);
  UpgradeRecord(failed);
  EXPECT_EQ(failed.error().reason(), v1::ErrorReason::LEASE_EXPIRED);
  EXPECT_FALSE(failed.has_result());
}

// A record written while the reason was a string (field 2 as its name) reads back with the enum, and
// the bytes of such a record parse as they were written.
TEST(JobStoreTest, RecordsWithTheReasonAsAStringGetTheEnum) {
  for (const auto& [written, expected] :
       std::vector<std::pair<std::string, Reason>>{{"MODEL_PARSE_FAILED", v1::ErrorReason::MODEL_PARSE_FAILED},
                                                   {"INTERNAL", v1::ErrorReason::INTERNAL},
                                                   {"SOMETHING_NEWER", v1::ErrorReason::UNKNOWN}}) {
    v1::Job old;
    old.set_name("jobs/old");
    old.set_state(v1::FAILED);
    v1::JobError* error = old.mutable_error();
    error->set_code(3);
    error->set_message("the file is not a model");
    error->GetReflection()->MutableUnknownFields(error)->AddLengthDelimited(2, written);
    v1::Job job;
    ASSERT_TRUE(job.ParseFromString(old.SerializeAsString()));
    UpgradeRecord(job);
    EXPECT_EQ(job.error().reason(), expected) << written;
    EXPECT_EQ(job.error().code(), 3);
    EXPECT_EQ(job.error().message(), "the file is not a model");
    EXPECT_TRUE(job.error().GetReflection()->GetUnknownFields(job.error()).empty()) << written;
  }
}

TEST(BlobStoreTest, VerifiedUploadInChunksWithResume) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 1 << 20);
  ASSERT_TRUE(store.ok());
  const std::string data = "0123456789abcdefghij";
  const std::string digest = Sha256OfBytes(data);
  {
    auto upload = (*store)->BeginUpload(digest, static_cast<int64_t>(data.size()), "session-1");
    ASSERT_TRUE(upload.ok());
    ASSERT_TRUE((*upload)->Append(0, data.substr(0, 8)).ok());
    // The connection drops here; the partial upload stays.
  }
  EXPECT_EQ((*store)->CommittedSize(digest, "session-1"), 8);
  EXPECT_EQ((*store)->CommittedSize(digest, "session-2"), 0) << "another session holds nothing";
  EXPECT_FALSE((*store)->Exists(digest));
  auto resumed = (*store)->BeginUpload(digest, static_cast<int64_t>(data.size()), "session-1");
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
  auto upload = (*store)->BeginUpload(claimed, 5, "s");
  ASSERT_TRUE((*upload)->Append(0, "12345").ok());
  absl::Status finished = (*upload)->Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(finished.message().find("CHECKSUM_MISMATCH"), std::string::npos);
  upload->reset();
  EXPECT_EQ((*store)->CommittedSize(claimed, "s"), 0);
  EXPECT_FALSE((*store)->Exists(claimed));
}

TEST(BlobStoreTest, RefusesBadDigestsOversizeDataAndConcurrentWritesToOneSession) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 100);
  EXPECT_EQ((*store)->BeginUpload("ABC", 1, "").status().code(), absl::StatusCode::kInvalidArgument);
  const std::string digest = Sha256OfBytes("x");
  EXPECT_EQ((*store)->BeginUpload(digest, 1, "no spaces").status().code(), absl::StatusCode::kInvalidArgument);
  auto too_large = (*store)->BeginUpload(digest, 1000, "");
  EXPECT_EQ(too_large.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_large.status().message().find("UPLOAD_TOO_LARGE"), std::string::npos);
  auto first = (*store)->BeginUpload(digest, 1, "mine");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*store)->BeginUpload(digest, 1, "mine").status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE((*store)->BeginUpload(digest, 1, "theirs").ok()) << "other sessions are not blocked";
  EXPECT_TRUE((*store)->BeginUpload(digest, 1, "").ok()) << "nor anonymous ones";
  EXPECT_EQ((*first)->Append(0, "xy").code(), absl::StatusCode::kInvalidArgument) << "past the declared size";
}

// Garbage written under a real file's hash, finished or left open, spoils only the writer's session.
TEST(BlobStoreTest, TheStorageQuotaCountsUploadsInFlight) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 100, /*max_stored_bytes=*/150);
  ASSERT_TRUE(store.ok());
  const std::string a(80, 'a'), b(80, 'b');
  auto first = (*store)->BeginUpload(Sha256OfBytes(a), 80, "first");
  ASSERT_TRUE(first.ok());
  auto second = (*store)->BeginUpload(Sha256OfBytes(b), 80, "second");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << "80 on the way + 80 > 150";
  EXPECT_NE(second.status().message().find("QUOTA_EXCEEDED"), std::string::npos) << second.status();
  ASSERT_TRUE((*first)->Append(0, a).ok());
  ASSERT_TRUE((*first)->Finish().ok());
  first->reset();
  EXPECT_EQ((*store)->StoredBytes(), 80);
  EXPECT_EQ((*store)->BeginUpload(Sha256OfBytes(b), 80, "second").status().code(), absl::StatusCode::kResourceExhausted)
      << "80 stored + 80 > 150";
  EXPECT_TRUE((*store)->BeginUpload(Sha256OfBytes("small"), 5, "third").ok());
}

TEST(BlobStoreTest, OneSessionCannotPoisonAnother) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 1 << 20);
  const std::string data(4096, 'm');
  const std::string digest = Sha256OfBytes(data);
  auto attacker = (*store)->BeginUpload(digest, static_cast<int64_t>(data.size()), "");
  ASSERT_TRUE(attacker.ok());
  ASSERT_TRUE((*attacker)->Append(0, std::string(1024, 'X')).ok());  // held open, never finished
  EXPECT_EQ((*store)->CommittedSize(digest, "owner"), 0);
  auto owner = (*store)->BeginUpload(digest, static_cast<int64_t>(data.size()), "owner");
  ASSERT_TRUE(owner.ok());
  ASSERT_TRUE((*owner)->Append(0, data).ok());
  ASSERT_TRUE((*owner)->Finish().ok());
  EXPECT_TRUE((*store)->Exists(digest));
}

TEST(BlobStoreTest, AbandonedPartialsExpireAndAlteredBlobsAreFound) {
  TempDir dir;
  auto store = BlobStore::Open(dir.path(), 1 << 20);
  const std::string digest = Sha256OfBytes("0123456789");
  {
    auto stale = (*store)->BeginUpload(digest, 10, "stale");
    ASSERT_TRUE((*stale)->Append(0, "01234").ok());
  }
  auto writing = (*store)->BeginUpload(digest, 10, "writing");
  ASSERT_TRUE((*writing)->Append(0, "012").ok());
  for (const auto& entry : fs::directory_iterator(dir.path() / "uploads")) {
    fs::last_write_time(entry.path(), fs::file_time_type::clock::now() - std::chrono::hours(48));
  }
  EXPECT_EQ((*store)->ExpireStaleUploads(std::chrono::hours(24)), 1) << "the session being written stays";
  EXPECT_EQ((*store)->CommittedSize(digest, "stale"), 0);
  EXPECT_EQ((*store)->CommittedSize(digest, "writing"), 3);
  EXPECT_EQ((*store)->ExpireStaleUploads(std::chrono::hours(24)), 0);

  ASSERT_TRUE((*writing)->Append(3, "3456789").ok());
  ASSERT_TRUE((*writing)->Finish().ok());
  EXPECT_FALSE((*store)->RemoveIfCorrupt(digest));
  std::ofstream((*store)->PathOf(digest), std::ios::binary) << "0123456780";
  EXPECT_TRUE((*store)->RemoveIfCorrupt(digest));
  EXPECT_FALSE((*store)->Exists(digest));
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
    auto store = SqliteJobStore::Open(dir.path() / "jobs.sqlite3");
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
  auto store = SqliteJobStore::Open(dir.path() / "jobs.sqlite3");
  ASSERT_TRUE(store.ok());
  auto job = (*store)->Get(name);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::RUNNING);
  // It held no lease in this run: the next recovery queues it again.
  auto recovered = (*store)->RecoverExpiredLeases(3);
  ASSERT_TRUE(recovered.ok());
  ASSERT_EQ(recovered->size(), 1u);
  EXPECT_EQ((*recovered)[0].state(), v1::QUEUED);
  EXPECT_EQ(*(*store)->QueueLength(), 1);
  EXPECT_EQ((*store)->FindByRequestId("", "retry-me")->name(), name);
  EXPECT_EQ((*store)->Get("jobs/nope").status().code(), absl::StatusCode::kNotFound);
}

// A model's own bytes (an op type of "Bad\xffOp") reach job errors; proto3 strings must stay valid
// UTF-8, or the job can be read by no client and by no later start of the server.
TEST(JobStoreTest, TextFromModelsIsStoredAsValidUtf8) {
  TempDir dir;
  std::string name;
  {
    auto store = SqliteJobStore::Open(dir.path() / "jobs.sqlite3");
    bool created;
    name = (*store)->Create(NewJob(), &created)->name();
    auto failed = (*store)->Update(name, [](v1::Job& j) {
      j.set_state(v1::FAILED);
      j.mutable_error()->set_message("No Op registered for Bad\xffOp");
    });
    ASSERT_TRUE(failed.ok());
    EXPECT_EQ(failed->error().message(), "No Op registered for Bad\\xffOp");
  }
  auto store = SqliteJobStore::Open(dir.path() / "jobs.sqlite3");
  auto job = (*store)->Get(name);
  ASSERT_TRUE(job.ok()) << "the job survives a restart";
  EXPECT_EQ(job->state(), v1::FAILED);
}

// A record that does not parse (written before the fix above, or damaged) neither hides its job nor
// lets a new job reuse its sequence number.
TEST(JobStoreTest, ADatabaseFromBeforeTenantsGainsTheTenantColumn) {
  TempDir dir;
  const fs::path database = dir.path() / "jobs.sqlite3";
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(database.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE jobs (sequence INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, "
                           "request_id TEXT, state INTEGER NOT NULL, job BLOB NOT NULL)",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    v1::Job old = NewJob();
    old.set_name("jobs/old");
    const std::string bytes = old.SerializeAsString();
    sqlite3_stmt* statement = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO jobs VALUES (1, 'jobs/old', '', 1, ?1)", -1, &statement, nullptr);
    sqlite3_bind_blob(statement, 1, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(statement), SQLITE_DONE);
    sqlite3_finalize(statement);
    sqlite3_close(db);
  }
  auto store = SqliteJobStore::Open(database);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Get("jobs/old")->tenant(), "");
  bool created = false;
  v1::Job owned = NewJob();
  owned.set_tenant("team-a");
  ASSERT_TRUE((*store)->Create(owned, &created).ok());
  EXPECT_EQ(*(*store)->CountActive("team-a"), 1);
}

TEST(JobStoreTest, AnUnreadableRecordKeepsItsJobAndItsNumber) {
  TempDir dir;
  const fs::path database = dir.path() / "jobs.sqlite3";
  std::string name;
  {
    auto store = SqliteJobStore::Open(database);
    bool created;
    ASSERT_TRUE((*store)->Create(NewJob(), &created).ok());
    v1::Job owned = NewJob("retry-me");
    owned.set_tenant("team-a");
    name = (*store)->Create(owned, &created)->name();
  }
  {
    // What an older server wrote: a Job whose error message holds the byte 0xff.
    v1::Job bad;
    bad.set_name(name);
    bad.set_state(v1::RUNNING);
    std::string bytes = bad.SerializeAsString();
    bytes += std::string("\x22\x05\x12\x03B\xffO", 7);  // progress { current_pass: "B\xffO" }
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(database.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* statement = nullptr;
    sqlite3_prepare_v2(db, "UPDATE jobs SET job = ?1 WHERE name = ?2", -1, &statement, nullptr);
    sqlite3_bind_blob(statement, 1, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(statement, 2, name.c_str(), -1, SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(statement), SQLITE_DONE);
    sqlite3_finalize(statement);
    sqlite3_close(db);
    v1::Job check;
    ASSERT_FALSE(check.ParseFromString(bytes)) << "the record must really be unreadable";
  }
  auto store = SqliteJobStore::Open(database);
  ASSERT_TRUE(store.ok()) << store.status();
  auto job = (*store)->Get(name);
  ASSERT_TRUE(job.ok()) << "the job is still there";
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->error().reason(), v1::ErrorReason::JOB_RECORD_UNREADABLE);
  EXPECT_EQ(job->request_id(), "retry-me");
  EXPECT_EQ(job->tenant(), "team-a") << "an unreadable record stays its owner's";
  ASSERT_EQ(*(*store)->QueueLength(), 1) << "only the readable queued job is left to run";
  auto claimed = (*store)->Claim({"r", std::chrono::seconds(30), WorkerDevice::kAny});
  ASSERT_TRUE(claimed.ok() && claimed->has_value());
  EXPECT_NE((**claimed).name(), name);
  bool created = false;
  auto next = (*store)->Create(NewJob(), &created);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(created);
  EXPECT_EQ((*store)->List(v1::JOB_STATE_UNSPECIFIED, 10, "")->jobs.size(), 3u);
}

TEST(JobStoreTest, ListsNewestFirstWithPagesAndStateFilter) {
  TempDir dir;
  auto store = SqliteJobStore::Open(dir.path() / "jobs.sqlite3");
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

TEST(TenantsTest, TokenFilesParseStrictlyAndTokensAreCheckedByDigest) {
  const std::string alice = Sha256OfBytes("alice"), root = Sha256OfBytes("root");
  auto table = TokenTable::Parse(absl::StrCat("# comment\n\n", alice, " team-a\n  ", root, "\tops  admin  \n"));
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  EXPECT_EQ(table->Find(alice)->tenant, "team-a");
  EXPECT_FALSE(table->Find(alice)->admin);
  EXPECT_TRUE(table->Find(root)->admin);
  EXPECT_FALSE(table->Find(Sha256OfBytes("mallory")).has_value());
  for (const std::string& bad : std::vector<std::string>{absl::StrCat(alice, "\n"), absl::StrCat("ABC team\n"),
                                absl::StrCat(alice, " team/../x\n"), absl::StrCat(alice, " team superuser\n"),
                                absl::StrCat(alice, " a\n", alice, " b\n")}) {
    auto refused = TokenTable::Parse(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find("AUTH_TOKENS_INVALID: line"), std::string::npos) << refused.status();
  }

  TempDir dir;
  const fs::path file = dir.path() / "tokens";
  std::ofstream(file) << alice << " team-a\n";
  auto auth = Authenticator::Open(file);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->Authenticate(absl::string_view("Bearer alice"))->tenant, "team-a");
  EXPECT_EQ((*auth)->Authenticate(std::nullopt).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate(absl::string_view("Bearer bob")).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate(absl::string_view("alice")).status().code(), absl::StatusCode::kUnauthenticated);
  std::ofstream(file, std::ios::trunc) << "garbage\n";
  EXPECT_FALSE((*auth)->Reload().ok());
  EXPECT_TRUE((*auth)->Authenticate(absl::string_view("Bearer alice")).ok()) << "a broken file keeps the old tokens";
  auto off = Authenticator::Open("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE((*off)->enabled());
  EXPECT_TRUE((*off)->Authenticate(std::nullopt)->admin) << "without tokens: one tenant, nothing hidden";
  EXPECT_FALSE(IsValidTenantName("..")) << "tenant names become folder names";
}

TEST(JobStoreTest, PageTokensAreSealedPerListingAndOutliveRestarts) {
  TempDir dir;
  const fs::path database = dir.path() / "jobs.sqlite3";
  std::string token;
  {
    auto store = SqliteJobStore::Open(database);
    ASSERT_TRUE(store.ok());
    bool created = false;
    for (int i = 0; i < 6; ++i) {
      v1::Job job = NewJob();
      job.set_tenant(i % 3 == 0 ? "team-a" : "team-b");  // team-a: jobs 1 and 4 of 6
      ASSERT_TRUE((*store)->Create(job, &created).ok());
    }
    auto first = (*store)->List(v1::JOB_STATE_UNSPECIFIED, 1, "", std::string("team-a"));
    ASSERT_TRUE(first.ok());
    token = first->next_page_token;
    ASSERT_EQ(token.size(), 32u);
    EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos);
    EXPECT_NE(token, "4") << "not the bare sequence number, which would count other tenants' jobs";
    EXPECT_EQ((*store)->List(v1::JOB_STATE_UNSPECIFIED, 1, token, std::string("team-b")).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "another listing's token is refused";
  }
  auto store = SqliteJobStore::Open(database);
  ASSERT_TRUE(store.ok());
  auto second = (*store)->List(v1::JOB_STATE_UNSPECIFIED, 1, token, std::string("team-a"));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->jobs.size(), 1u);
  EXPECT_EQ(second->jobs[0].tenant(), "team-a");
  EXPECT_TRUE(second->next_page_token.empty()) << "team-a has two jobs";
}

TEST(JobStoreTest, WatchersWakeOnChange) {
  TempDir dir;
  auto store = SqliteJobStore::Open(dir.path() / "jobs.sqlite3");
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

TEST(JobManagerHelpersTest, ARetryMustRepeatTheRequest) {
  v1::Job existing;
  existing.mutable_model()->set_sha256(std::string(64, 'a'));
  existing.mutable_config()->set_preset(v1::Pipelines::basic);
  v1::CreateJobRequest retry;
  *retry.mutable_model() = existing.model();
  *retry.mutable_config() = existing.config();
  retry.mutable_model()->set_display_name("renamed.onnx");  // cosmetic: still the same request
  EXPECT_EQ(RequestDifference(existing, retry), "");
  v1::CreateJobRequest other_model = retry;
  other_model.mutable_model()->set_sha256(std::string(64, 'b'));
  EXPECT_EQ(RequestDifference(existing, other_model), "another model");
  v1::CreateJobRequest other_data = retry;
  other_data.mutable_model()->add_external_data()->set_name("w.bin");
  EXPECT_EQ(RequestDifference(existing, other_data), "other external data files");
  v1::CreateJobRequest other_config = retry;
  other_config.mutable_config()->set_preset(v1::Pipelines::none);
  EXPECT_EQ(RequestDifference(existing, other_config), "another config");
  v1::CreateJobRequest other_inputs = retry;
  other_inputs.add_inputs()->set_name("x");
  EXPECT_EQ(RequestDifference(existing, other_inputs), "other inputs");
}

TEST(WorkerProtocolTest, DigestManifestsAndEscapedLines) {
  const std::vector<FileDigest> files = {{std::string(64, 'a'), "model.onnx"}, {std::string(64, 'b'), "inputs/0.pb"}};
  auto parsed = ParseDigestManifest(FormatDigestManifest(files));
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[1].file, "inputs/0.pb");
  EXPECT_FALSE(ParseDigestManifest(std::string(64, 'a') + "\t../x\n").ok());
  EXPECT_FALSE(ParseDigestManifest("abc\tmodel.onnx\n").ok());
  std::string line = FormatExternalData("we\nird\xff.bin");
  ASSERT_EQ(line.back(), '\n');
  line.pop_back();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  WorkerLine external = ParseWorkerLine(line);
  EXPECT_EQ(external.kind, WorkerLine::Kind::kExternalData);
  EXPECT_EQ(external.text, "we\nird\xff.bin");
  WorkerLine status = ParseWorkerLine("status 3 0 No Op registered for Bad\xffOp");
  EXPECT_EQ(status.status.message(), "No Op registered for Bad\\xffOp");
  EXPECT_EQ(ReasonOf(status.status), v1::ErrorReason::INVALID_ARGUMENT);
  // The reason crosses from the worker beside the message.
  std::string failed =
      FormatStatus(Failure(absl::StatusCode::kAborted, v1::ErrorReason::PARITY_FAILED, "outputs differ"));
  failed.pop_back();
  WorkerLine parity = ParseWorkerLine(failed);
  ASSERT_EQ(parity.kind, WorkerLine::Kind::kStatus);
  EXPECT_EQ(parity.status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonOf(parity.status), v1::ErrorReason::PARITY_FAILED);
  EXPECT_EQ(TextOf(parity.status), "outputs differ");
  EXPECT_EQ(ParseWorkerLine("status 3 99999 unknown reason").kind, WorkerLine::Kind::kOther);
}

TEST(JobManagerHelpersTest, SafeNamesAndReasons) {
  for (const char* good : {"weights.bin", "data/part-1.bin"}) EXPECT_TRUE(IsSafeRelativeName(good)) << good;
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a//b", "./x", "a\\b"}) {
    EXPECT_FALSE(IsSafeRelativeName(bad)) << bad;
  }
  // A job's error holds the reason the status carries and the text after it; a status without one is
  // named after its code, its message whole.
  v1::Job job;
  SetOutcome(job, Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED, "nope"), nullptr);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_EQ(job.error().reason(), v1::ErrorReason::MODEL_PARSE_FAILED);
  EXPECT_EQ(job.error().message(), "nope");
  SetOutcome(job, absl::InternalError("DISK: full"), nullptr);
  EXPECT_EQ(job.error().reason(), v1::ErrorReason::INTERNAL);
  EXPECT_EQ(job.error().message(), "DISK: full") << "a message is not parsed for a reason";
  SetOutcome(job, absl::CancelledError("stopped"), nullptr);
  EXPECT_EQ(job.state(), v1::CANCELLED);
  EXPECT_EQ(job.error().reason(), v1::ErrorReason::CANCELLED);
}

}  // namespace
}  // namespace onnxopt::server

namespace onnxopt::server {
namespace {

// A worker may map its model (and a result as big) beyond its memory limit: mapped pages are the
// kernel's to drop, and a 7B decoder's 29 GB must open under the default 16 GiB.
TEST(WorkerLimitsTest, TheAddressSpaceLimitMakesRoomForTheMappedModelAndItsResult) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(WorkerAddressSpaceBytes(16384, 0), 16 * kGiB);
  EXPECT_EQ(WorkerAddressSpaceBytes(16384, 27 * kGiB), 70 * kGiB);
  EXPECT_EQ(WorkerAddressSpaceBytes(0, 27 * kGiB), 0) << "no limit stays none";
  EXPECT_EQ(WorkerAddressSpaceBytes(40, -1), 40 << 20);
}

}  // namespace
}  // namespace onnxopt::server
