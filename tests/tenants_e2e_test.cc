// Several teams on one server (--auth-tokens-file), tried as a hostile tenant would, through the real
// server and CLI: no token or a wrong one is UNAUTHENTICATED; tenant B's every RPC on tenant A's job
// and blob names answers exactly like a name that does not exist; request ids and blobs are per
// tenant; admins list everyone; health stays open; tokens never reach the logs; SIGHUP re-reads the file.
#include "absl/strings/str_replace.h"
#include "client/client.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "optimizer/sha256.h"
#include "tests/e2e_harness.h"

namespace onnxopt {
namespace {
namespace fs = std::filesystem;
using testing::E2eTest;
using testing::FixturePath;
using testing::Slurp;

constexpr char kAlice[] = "alice-secret-token-1";
constexpr char kBob[] = "bob-secret-token-2";
constexpr char kRoot[] = "root-secret-token-3";

class TenantsTest : public E2eTest {
 protected:
  void StartWithTokens(std::vector<std::string> flags = {}) {
    tokens_ = WriteFile("tokens.txt", absl::StrCat("# test tokens\n", Sha256OfBytes(kAlice), " team-a\n",
                                                   Sha256OfBytes(kBob), "\tteam-b\n\n", Sha256OfBytes(kRoot),
                                                   " ops admin\n"));
    flags.push_back(absl::StrCat("--auth-tokens-file=", tokens_.string()));
    StartServer(flags);
  }

  std::unique_ptr<v1::Optimizer::Stub> stub() {
    return v1::Optimizer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  static void As(const char* token, grpc::ClientContext* context) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }

  fs::path tokens_;
};

TEST_F(TenantsTest, NoTokenOrAWrongOneIsUnauthenticatedButHealthStaysOpen) {
  StartWithTokens();
  Result none = Cli({"list"});
  EXPECT_NE(none.code, 0);
  EXPECT_TRUE(absl::StrContains(none.err, "UNAUTHENTICATED")) << none.err;
  Result wrong = Cli({"list", "--token", "not-a-token"});
  EXPECT_TRUE(absl::StrContains(wrong.err, "UNAUTHENTICATED")) << wrong.err;
  Result right = Cli({"list"}, {absl::StrCat("ONNXOPT_TOKEN=", kAlice)});
  EXPECT_EQ(right.code, 0) << right.err;

  for (const std::string& header : std::vector<std::string>{"", "Bearer ", "Basic abc", absl::StrCat("bearer ", kAlice)}) {
    grpc::ClientContext context;
    if (!header.empty()) context.AddMetadata("authorization", header);
    v1::ServerInfo info;
    EXPECT_EQ(stub()->GetServerInfo(&context, {}, &info).error_code(), grpc::StatusCode::UNAUTHENTICATED) << header;
  }
  EXPECT_EQ(testing::HealthStatus(address_, ""), 1) << "health needs no token";
  EXPECT_EQ(testing::HealthStatus(address_, "onnxopt.v1.Optimizer"), 1);
}

TEST_F(TenantsTest, AnotherTenantsNamesAnswerLikeNamesThatDoNotExist) {
  StartWithTokens();
  const std::vector<std::string> alice = {absl::StrCat("ONNXOPT_TOKEN=", kAlice)};
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  const fs::path model = FixturePath("cnn_tiny.onnx");
  Result submitted = Cli({"submit", model.string(), "--config", config.string(), "--request-id", "shared-id", "--wait",
                          "-o", (dir_ / "alice.onnx").string()},
                         alice);
  ASSERT_EQ(submitted.code, 0) << submitted.err;
  Result listed = Cli({"list", "--json"}, alice);
  ASSERT_EQ(listed.code, 0) << listed.err;
  const size_t at = listed.out.find("jobs/");
  ASSERT_NE(at, std::string::npos) << listed.out;
  const std::string job = listed.out.substr(at, listed.out.find('"', at) - at);
  const std::string ghost = "jobs/0123456789abcdef";

  // What Bob hears about Alice's job is, word for word, what anyone hears about a job that never was.
  auto expect_hidden = [&](const std::string& rpc, const std::function<grpc::Status(const std::string&)>& call) {
    const grpc::Status theirs = call(job), missing = call(ghost);
    EXPECT_EQ(theirs.error_code(), grpc::StatusCode::NOT_FOUND) << rpc << ": " << theirs.error_message();
    EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND) << rpc;
    EXPECT_EQ(absl::StrReplaceAll(theirs.error_message(), {{job, "NAME"}}),
              absl::StrReplaceAll(missing.error_message(), {{ghost, "NAME"}}))
        << rpc;
  };
  auto client = stub();
  expect_hidden("GetJob", [&](const std::string& name) {
    grpc::ClientContext context;
    As(kBob, &context);
    v1::GetJobRequest request;
    request.set_name(name);
    v1::Job response;
    return client->GetJob(&context, request, &response);
  });
  expect_hidden("CancelJob", [&](const std::string& name) {
    grpc::ClientContext context;
    As(kBob, &context);
    v1::CancelJobRequest request;
    request.set_name(name);
    v1::Job response;
    return client->CancelJob(&context, request, &response);
  });
  expect_hidden("GetReport", [&](const std::string& name) {
    grpc::ClientContext context;
    As(kBob, &context);
    v1::GetReportRequest request;
    request.set_name(name);
    v1::Report response;
    return client->GetReport(&context, request, &response);
  });
  expect_hidden("WatchJob", [&](const std::string& name) {
    grpc::ClientContext context;
    As(kBob, &context);
    v1::WatchJobRequest request;
    request.set_name(name);
    auto reader = client->WatchJob(&context, request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event)) << "no event about someone else's job";
    return reader->Finish();
  });
  for (const char* artifact : {"model.onnx", "report.json"}) {
    expect_hidden(absl::StrCat("Download ", artifact), [&](const std::string& name) {
      grpc::ClientContext context;
      As(kBob, &context);
      v1::DownloadRequest request;
      request.set_name(name);
      request.set_artifact(artifact);
      auto reader = client->Download(&context, request);
      v1::DownloadChunk chunk;
      EXPECT_FALSE(reader->Read(&chunk));
      return reader->Finish();
    });
  }

  // Alice's model is no blob of Bob's: not complete, nothing committed, and no job can name it.
  const std::string digest = *Sha256OfFile(model);
  {
    grpc::ClientContext context;
    As(kBob, &context);
    v1::GetUploadStatusRequest request;
    request.set_sha256(digest);
    v1::UploadStatus status;
    ASSERT_TRUE(client->GetUploadStatus(&context, request, &status).ok());
    EXPECT_FALSE(status.complete());
    EXPECT_EQ(status.committed_size(), 0);
  }
  {
    grpc::ClientContext context;
    As(kBob, &context);
    v1::CreateJobRequest request;
    request.mutable_model()->set_sha256(digest);
    v1::Job response;
    const grpc::Status status = client->CreateJob(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), "BLOB_NOT_FOUND")) << status.error_message();
  }

  // Bob's list is empty; his job with Alice's request id is his own, not hers and not a conflict.
  const std::vector<std::string> bob = {absl::StrCat("ONNXOPT_TOKEN=", kBob)};
  Result bob_list = Cli({"list", "--json"}, bob);
  EXPECT_EQ(bob_list.code, 0) << bob_list.err;
  EXPECT_FALSE(absl::StrContains(bob_list.out, job)) << bob_list.out;
  Result bob_job = Cli({"submit", FixturePath("cnn_bn.onnx").string(), "--config", config.string(), "--request-id",
                        "shared-id"},
                       bob);
  EXPECT_EQ(bob_job.code, 0) << bob_job.err;
  EXPECT_FALSE(absl::StrContains(bob_job.out, job));

  // The admin lists both tenants' jobs and reads Alice's.
  const std::vector<std::string> root = {absl::StrCat("ONNXOPT_TOKEN=", kRoot)};
  Result all = Cli({"list", "--json"}, root);
  EXPECT_TRUE(absl::StrContains(all.out, job)) << all.out;
  EXPECT_TRUE(absl::StrContains(all.out, "team-b")) << all.out;
  Result status = Cli({"status", job, "--json"}, root);
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_TRUE(absl::StrContains(status.out, "team-a")) << status.out;
  Result alice_status = Cli({"status", job}, alice);
  EXPECT_EQ(alice_status.code, 0) << alice_status.err;
  Result admin_delete = Cli({"delete", job}, root);
  EXPECT_TRUE(absl::StrContains(admin_delete.err, "PERMISSION_DENIED: NOT_OWNER")) << "admins read, owners delete: "
                                                                                   << admin_delete.err;

  // Blobs live apart per tenant.
  EXPECT_TRUE(fs::exists(dir_ / "data" / "tenants" / "team-a" / "blobs" / digest));
  EXPECT_FALSE(fs::exists(dir_ / "data" / "blobs" / digest));

  // No token in clear anywhere the server writes.
  StopServer();
  for (const fs::path& log : {dir_ / "server.out", dir_ / "server.err"}) {
    const std::string text = Slurp(log);
    for (const char* token : {kAlice, kBob, kRoot}) EXPECT_FALSE(absl::StrContains(text, token)) << log;
  }
}

TEST_F(TenantsTest, QuotasArePerTenantAndNameTheirLimit) {
  // Room for the small CNNs (17-19 KB each), not for bert_tiny (351 KB); one queued or running job each.
  tokens_ = WriteFile("tokens.txt", absl::StrCat(Sha256OfBytes(kAlice), " team-a\n", Sha256OfBytes(kBob), " team-b\n"));
  StartServer({absl::StrCat("--auth-tokens-file=", tokens_.string()), "--tenant-max-active-jobs=1",
               "--tenant-max-stored-bytes=100000", "--workers=1", "--drain-grace-seconds=0"});  // jobs run at the end
  const std::vector<std::string> alice = {absl::StrCat("ONNXOPT_TOKEN=", kAlice)};
  const std::vector<std::string> bob = {absl::StrCat("ONNXOPT_TOKEN=", kBob)};
  Result first = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", LongJobConfig().string()}, alice);
  ASSERT_EQ(first.code, 0) << first.err;
  Result second = Cli({"submit", FixturePath("cnn_bn.onnx").string()}, alice);
  EXPECT_NE(second.code, 0);
  EXPECT_TRUE(absl::StrContains(second.err, "RESOURCE_EXHAUSTED")) << second.err;
  EXPECT_TRUE(absl::StrContains(second.err, "QUOTA_EXCEEDED")) << second.err;
  EXPECT_TRUE(absl::StrContains(second.err, "tenant-max-active-jobs")) << second.err;
  Result bobs = Cli({"submit", FixturePath("cnn_bn.onnx").string(), "--config", LongJobConfig().string()}, bob);
  EXPECT_EQ(bobs.code, 0) << "another tenant's quota is its own: " << bobs.err;
  Result big = Cli({"submit", FixturePath("bert_tiny.onnx").string()}, bob);
  EXPECT_NE(big.code, 0);
  EXPECT_TRUE(absl::StrContains(big.err, "tenant-max-stored-bytes")) << big.err;
  EXPECT_FALSE(fs::exists(dir_ / "data" / "tenants" / "team-b" / "blobs" / *Sha256OfFile(FixturePath("bert_tiny.onnx"))));
  // A finished job frees its slot.
  const std::string job = std::string(absl::StripTrailingAsciiWhitespace(first.out));
  EXPECT_EQ(Cli({"cancel", job}, alice).code, 0);
  ASSERT_TRUE(WaitForStatus(job, "CANCELLED", alice));
  Result after = Cli({"submit", FixturePath("cnn_bn.onnx").string(), "--config", LongJobConfig().string()}, alice);
  EXPECT_EQ(after.code, 0) << after.err;
}

TEST_F(TenantsTest, DeletingAJobFreesItsFilesAndTheBlobsOnlyItUsed) {
  StartWithTokens({"--drain-grace-seconds=0"});  // a running job is interrupted at stop and stays unfinished
  const std::vector<std::string> alice = {absl::StrCat("ONNXOPT_TOKEN=", kAlice)};
  const std::vector<std::string> bob = {absl::StrCat("ONNXOPT_TOKEN=", kBob)};
  const fs::path quick = WriteFile("quick.json", R"({"benchmark": {"skip": true}})");
  const fs::path other = WriteFile("other.json", R"({"benchmark": {"skip": true}, "preset": "none"})");
  auto submit = [&](const fs::path& model, const fs::path& config) {
    Result result = Cli({"submit", model.string(), "--config", config.string(), "--wait", "--json"}, alice);
    EXPECT_EQ(result.code, 0) << result.err;
    const size_t at = result.out.find("jobs/");
    return result.out.substr(at, result.out.find('"', at) - at);
  };
  const fs::path tiny = FixturePath("cnn_tiny.onnx");
  const std::string first = submit(tiny, quick), second = submit(tiny, other);  // one blob, two jobs
  const fs::path blob = dir_ / "data" / "tenants" / "team-a" / "blobs" / *Sha256OfFile(tiny);
  ASSERT_TRUE(fs::exists(blob));
  ASSERT_TRUE(fs::exists(dir_ / "data" / "jobs" / first.substr(5)));

  Result running = Cli({"submit", FixturePath("cnn_bn.onnx").string(), "--config", LongJobConfig().string()}, alice);
  ASSERT_EQ(running.code, 0) << running.err;
  const std::string busy = std::string(absl::StripTrailingAsciiWhitespace(running.out));
  Result refused = Cli({"delete", busy}, alice);
  EXPECT_TRUE(absl::StrContains(refused.err, "JOB_NOT_DONE")) << refused.err;

  Result theirs = Cli({"delete", first}, bob);
  EXPECT_TRUE(absl::StrContains(theirs.err, "JOB_NOT_FOUND")) << "another tenant cannot delete it: " << theirs.err;
  Result deleted = Cli({"delete", first, "--json"}, alice);
  ASSERT_EQ(deleted.code, 0) << deleted.err;
  EXPECT_TRUE(absl::StrContains(deleted.out, "\"blobs_deleted\": 0")) << "the second job still uses the blob: " << deleted.out;
  EXPECT_TRUE(fs::exists(blob));
  EXPECT_FALSE(fs::exists(dir_ / "data" / "jobs" / first.substr(5)));
  EXPECT_TRUE(absl::StrContains(Cli({"status", first}, alice).err, "JOB_NOT_FOUND"));
  Result last = Cli({"delete", second, "--json"}, alice);
  ASSERT_EQ(last.code, 0) << last.err;
  EXPECT_TRUE(absl::StrContains(last.out, "\"blobs_deleted\": 1")) << last.out;
  EXPECT_FALSE(fs::exists(blob)) << "no job uses it any more";

  // Retention: at the next start, finished jobs older than it go; the unfinished one stays.
  const std::string kept = submit(FixturePath("cnn_bn.onnx"), quick);
  EXPECT_EQ(Cli({"cancel", busy}, alice).code, 0);
  ASSERT_TRUE(WaitForStatus(busy, "CANCELLED", alice));
  Result queued = Cli({"submit", tiny.string(), "--config", LongJobConfig().string()}, alice);
  ASSERT_EQ(queued.code, 0) << queued.err;
  const std::string unfinished = std::string(absl::StripTrailingAsciiWhitespace(queued.out));
  // And a blob uploaded for a job that never came: garbage once older than the upload expiry.
  client::Client uploader(address_);
  uploader.set_token(kAlice);
  ASSERT_TRUE(uploader.UploadFile(FixturePath("bert_tiny.onnx")).ok());
  const fs::path orphan = dir_ / "data" / "tenants" / "team-a" / "blobs" / *Sha256OfFile(FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(fs::exists(orphan));
  StopServer();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  StartServer({absl::StrCat("--auth-tokens-file=", tokens_.string()), "--job-retention-hours=0.0003",
               "--upload-expiry-hours=0.0003", "--drain-grace-seconds=0"});
  auto gone = [&](const std::string& job) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (absl::StrContains(Cli({"status", job}, alice).err, "JOB_NOT_FOUND")) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  };
  EXPECT_TRUE(gone(kept));
  EXPECT_TRUE(gone(busy));
  Result still = Cli({"status", unfinished}, alice);
  EXPECT_EQ(still.code, 0) << "a queued or running job is never expired: " << still.err;
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "server.out"), "expired job(s)"));
  EXPECT_FALSE(fs::exists(orphan)) << "an upload no job used is collected";
  EXPECT_TRUE(fs::exists(blob)) << "the unfinished job's model stays";
}

TEST_F(TenantsTest, TheSameRequestIsServedFromTheCacheOfItsOwnTenantOnly) {
  StartWithTokens();
  const std::vector<std::string> alice = {absl::StrCat("ONNXOPT_TOKEN=", kAlice)};
  const std::vector<std::string> bob = {absl::StrCat("ONNXOPT_TOKEN=", kBob)};
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"iterations": 50, "warmup_runs": 1}})");
  const fs::path model = FixturePath("cnn_tiny.onnx");
  auto job_of = [](const std::string& json) {
    const size_t at = json.find("jobs/");
    return json.substr(at, json.find('"', at) - at);
  };
  auto field = [](const std::string& json, const std::string& name) {
    const size_t at = json.find("\"" + name + "\": ");
    if (at == std::string::npos) return std::string();
    const size_t begin = at + name.size() + 4;
    return json.substr(begin, json.find_first_of(",\n", begin) - begin);
  };
  Result first = Cli({"submit", model.string(), "--config", config.string(), "--wait", "--json", "-o",
                      (dir_ / "first.onnx").string()}, alice);
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string original = job_of(first.out);
  const std::string original_report = Cli({"report", original, "--json"}, alice).out;

  const auto started = std::chrono::steady_clock::now();
  const fs::path urgent = WriteFile("urgent.json", R"({"benchmark": {"iterations": 50, "warmup_runs": 1}, "priority": 5})");
  Result again = Cli({"submit", model.string(), "--config", urgent.string(), "--wait", "--json", "-o",
                      (dir_ / "again.onnx").string()}, alice);  // priority is not part of the result
  ASSERT_EQ(again.code, 0) << again.err;
  const std::string cached = job_of(again.out);
  EXPECT_NE(cached, original);
  Result status = Cli({"status", cached, "--json"}, alice);
  EXPECT_TRUE(absl::StrContains(status.out, absl::StrCat("\"cached_from\": \"", original, "\""))) << status.out;
  const std::string report = Cli({"report", cached, "--json"}, alice).out;
  EXPECT_TRUE(absl::StrContains(report, absl::StrCat("\"cached_from\": \"", original, "\""))) << report;
  EXPECT_TRUE(absl::StrContains(report, "served from the result cache")) << report;
  EXPECT_EQ(field(report, "time"), field(original_report, "time")) << "the figures keep the time they were measured";
  EXPECT_FALSE(field(report, "time").empty()) << report;
  EXPECT_EQ(field(report, "speedup"), field(original_report, "speedup"));
  EXPECT_EQ(Slurp(dir_ / "again.onnx"), Slurp(dir_ / "first.onnx")) << "the same model";
  EXPECT_TRUE(absl::StrContains(testing::ScrapeMetrics(MetricsPort()), "onnxopt_result_cache_hits_total 1"));
  std::cout << "cache hit round trip: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s\n";

  // "cache": false runs it again; another tenant never sees Alice's results.
  const fs::path fresh = WriteFile("fresh.json", R"({"benchmark": {"iterations": 50, "warmup_runs": 1}, "cache": false})");
  Result rerun = Cli({"submit", model.string(), "--config", fresh.string(), "--wait", "--json", "-o",
                      (dir_ / "rerun.onnx").string()}, alice);
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_FALSE(absl::StrContains(Cli({"status", job_of(rerun.out), "--json"}, alice).out, "\"cached_from\": \"jobs/"));
  Result bobs = Cli({"submit", model.string(), "--config", config.string(), "--wait", "--json", "-o",
                     (dir_ / "bob.onnx").string()}, bob);
  ASSERT_EQ(bobs.code, 0) << bobs.err;
  EXPECT_FALSE(absl::StrContains(Cli({"status", job_of(bobs.out), "--json"}, bob).out, "\"cached_from\": \"jobs/"));

  // The cached job outlives the deletion of the one it came from.
  ASSERT_EQ(Cli({"delete", original}, alice).code, 0);
  Result download = Cli({"download", cached, "-o", (dir_ / "later.onnx").string()}, alice);
  EXPECT_EQ(download.code, 0) << download.err;
  EXPECT_EQ(Slurp(dir_ / "later.onnx"), Slurp(dir_ / "first.onnx"));
}

TEST_F(TenantsTest, SighupReloadsTheTokensAndKeepsThemWhenTheFileIsBroken) {
  StartWithTokens();
  const std::vector<std::string> carol = {"ONNXOPT_TOKEN=carol-new-token"};
  EXPECT_TRUE(absl::StrContains(Cli({"list"}, carol).err, "UNAUTHENTICATED"));
  std::ofstream(tokens_, std::ios::app) << Sha256OfBytes("carol-new-token") << " team-c\n";
  ASSERT_EQ(kill(server_, SIGHUP), 0);
  auto works = [&](const std::vector<std::string>& env) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Cli({"list"}, env).code == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  EXPECT_TRUE(works(carol)) << Slurp(dir_ / "server.err");
  std::ofstream(tokens_, std::ios::trunc) << "not a token line\n";
  ASSERT_EQ(kill(server_, SIGHUP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Cli({"list"}, carol).code, 0) << "a broken file leaves the tokens in use";
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "server.err"), "AUTH_TOKENS_INVALID: line 1"));
}

}  // namespace
}  // namespace onnxopt
