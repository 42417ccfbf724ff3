// From result to deployment, through the real server and CLI: a Triton repository in one command,
// labels and lineage, the default request id, health probes, and retries that survive the server
// being killed and restarted while the CLI waits and while it downloads, or drained (SIGTERM) while a
// client uploads or downloads.
#include <signal.h>

#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "onnx/onnx_pb.h"
#include "optimizer/model_io.h"
#include "optimizer/sha256.h"
#include "tests/e2e_harness.h"

namespace onnxopt::testing {
namespace {

class DeliveryTest : public E2eTest {
 protected:
  int Port() const {
    int port = 0;
    EXPECT_TRUE(absl::SimpleAtoi(address_.substr(address_.rfind(':') + 1), &port));
    return port;
  }

  // SIGKILL, then a new server on the same port and data folder (a pod restarted in place).
  void KillAndRestart() {
    const int port = Port();
    kill(server_, SIGKILL);
    WaitFor(server_, std::chrono::seconds(30));
    server_ = -1;
    StartServer({absl::StrCat("--listen=127.0.0.1:", port)});
  }

  // SIGTERM: the server drains (a second for running jobs, then two for open streams) and exits 0; then a new one
  // on the same port and data folder (a rolling update).
  void DrainAndRestart() {
    const int port = Port();
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(StopServer(), 0) << Slurp(dir_ / "server.err");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15)) << "a stream held the drain";
    StartServer({absl::StrCat("--listen=127.0.0.1:", port), "--drain-grace-seconds=1"});
  }

  // A model of several chunks: a 3 MiB weight.
  fs::path BigModel() {
    onnx::GraphProto graph;
    graph.set_name("big");
    *graph.add_input() = FloatValue("x", {1, 786432});
    *graph.add_initializer() = FloatTensor("w", {1, 786432}, RandomFloats(786432, 7));
    *graph.add_node() = MakeNode("Add", {"x", "w"}, {"y"});
    *graph.add_output() = FloatValue("y", {1, 786432});
    return WriteFile("big.onnx", MakeModel(graph).SerializeAsString());
  }

  // A download that `restart` breaks after its first chunk resumes from the bytes already held.
  void ExpectADownloadResumesThrough(const std::function<void()>& restart) {
    const fs::path config = WriteFile("skip.json", R"({"validation": {"skip": true}, "benchmark": {"skip": true}})");
    Result submitted = Cli({"submit", BigModel().string(), "--config", config.string(), "--wait", "-o",
                            (dir_ / "first.onnx").string()});
    ASSERT_EQ(submitted.code, 0) << submitted.err;
    client::Client client(address_);
    auto jobs = client.ListJobs(v1::SUCCEEDED, 1, "");
    ASSERT_TRUE(jobs.ok() && jobs->jobs_size() == 1);
    const std::string job = jobs->jobs(0).name();

    std::vector<int64_t> progress;
    bool restarted = false;
    absl::Status downloaded = client.Download(job, "model.onnx", dir_ / "resumed.onnx", [&](int64_t done, int64_t) {
      progress.push_back(done);
      if (!restarted) {  // after the first chunk
        restarted = true;
        restart();
      }
    });
    ASSERT_TRUE(downloaded.ok()) << downloaded;
    EXPECT_TRUE(restarted);
    ASSERT_GE(progress.size(), 3u);
    for (size_t i = 1; i < progress.size(); ++i) EXPECT_GT(progress[i], progress[i - 1]) << "never from zero again";
    EXPECT_EQ(Slurp(dir_ / "resumed.onnx"), Slurp(dir_ / "first.onnx")) << "the same bytes as an unbroken download";
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_FALSE(absl::EndsWith(entry.path().string(), ".partial")) << entry.path();
    }
  }

  std::map<std::string, std::string> MetadataOf(const fs::path& model) {
    absl::StatusOr<onnx::ModelProto> parsed = ParseModelFile(model);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    std::map<std::string, std::string> props;
    if (parsed.ok()) {
      for (const auto& entry : parsed->metadata_props()) props[entry.key()] = entry.value();
    }
    return props;
  }
};

TEST_F(DeliveryTest, OneCommandFromModelToATritonRepositoryWithLabelsAndLineage) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"iterations": 20}})");
  const fs::path repo = dir_ / "repo";
  const std::vector<std::string> submit = {"submit", FixturePath("bert_tiny.onnx").string(), "--config", config.string(),
                                           "--label", "team=search", "--label", "mlflow_run_id=r42", "--wait",
                                           "-o", repo.string(), "--layout", "triton", "--model-name", "bert"};
  Result result = Cli(submit);
  ASSERT_EQ(result.code, 0) << result.err << result.out;
  EXPECT_TRUE(absl::StrContains(result.out, "model repository: " + repo.string())) << result.out;
  ASSERT_TRUE(fs::exists(repo / "bert" / "1" / "model.onnx"));
  ASSERT_TRUE(fs::exists(repo / "bert" / "onnxopt_report.json"));
  const std::string triton = Slurp(repo / "bert" / "config.pbtxt");
  EXPECT_TRUE(absl::StrContains(triton, "backend: \"onnxruntime\"")) << triton;
  EXPECT_TRUE(absl::StrContains(triton, "max_batch_size: 8")) << triton;
  EXPECT_TRUE(absl::StrContains(triton, "name: \"input_ids\"")) << triton;
  EXPECT_TRUE(absl::StrContains(triton, "onnxopt_min_onnxruntime_version")) << triton;
  EXPECT_FALSE(fs::exists(repo / ".onnxopt-download-")) << "staging removed";

  Result list = Cli({"list", "--json"});
  const size_t at = list.out.find("\"name\": \"jobs/");
  ASSERT_NE(at, std::string::npos) << list.out;
  const std::string job = list.out.substr(at + 9, list.out.find('"', at + 9) - at - 9);
  // Lineage in the delivered model.
  const auto props = MetadataOf(repo / "bert" / "1" / "model.onnx");
  EXPECT_EQ(props.count("onnxopt.job") ? props.at("onnxopt.job") : "", job);
  EXPECT_EQ(props.count("onnxopt.parity") ? props.at("onnxopt.parity") : "", "passed");
  EXPECT_EQ(props.count("onnxopt.source_sha256"), 1u);
  EXPECT_EQ(props.count("onnxopt.speedup"), 1u);

  // Labels find the job; another team's filter does not.
  EXPECT_TRUE(absl::StrContains(Cli({"list", "--label", "team=search"}).out, job));
  EXPECT_FALSE(absl::StrContains(Cli({"list", "--label", "team=ads"}).out, job));
  Result bad_label = Cli({"list", "--label", "Team=x"});
  EXPECT_EQ(bad_label.code, 5) << bad_label.err;
  EXPECT_TRUE(absl::StrContains(bad_label.err, "BAD_LABEL")) << bad_label.err;

  Result mlflow = Cli({"report", job, "--format", "mlflow"});
  ASSERT_EQ(mlflow.code, 0) << mlflow.err;
  for (const char* key : {"\"speedup\"", "\"parity_max_abs_error\"", "\"onnxopt.job\"", "\"mlflow_run_id\": \"r42\""}) {
    EXPECT_TRUE(absl::StrContains(mlflow.out, key)) << key << " in " << mlflow.out;
  }

  // The same submit again is a retry: the default request id finds the first job, and a version that
  // exists is never overwritten.
  Result again = Cli(submit);
  EXPECT_EQ(again.code, 5) << again.out << again.err;
  EXPECT_TRUE(absl::StrContains(again.err, "REPOSITORY_VERSION_EXISTS")) << again.err;
  Result json = Cli({"submit", FixturePath("bert_tiny.onnx").string(), "--config", config.string(), "--label",
                     "team=search", "--label", "mlflow_run_id=r42", "--json"});
  EXPECT_TRUE(absl::StrContains(json.out, "\"name\": \"" + job + "\"")) << json.out;
  Result download = Cli({"download", job, "-o", repo.string(), "--layout", "kserve", "--model-name", "bert",
                         "--version", "2"});
  ASSERT_EQ(download.code, 0) << download.err;
  EXPECT_TRUE(fs::exists(repo / "bert" / "2" / "model.onnx"));
  EXPECT_TRUE(fs::exists(repo / "inferenceservice.yaml"));

  // The probe the Helm chart runs.
  EXPECT_EQ(Cli({"health"}).code, 0);
  Result service = Cli({"health", "--service", "onnxopt.v1.Optimizer"});
  EXPECT_EQ(service.code, 0) << service.err;
  EXPECT_TRUE(absl::StrContains(service.out, "SERVING"));
  EXPECT_EQ(Cli({"health", "--service", "no.such.Service"}).code, 1);
  EXPECT_EQ(StopServer(), 0);
  Result down = Cli({"health", "--timeout", "1"});
  EXPECT_EQ(down.code, 1) << down.out;
}

// A decoder as the folder ONNX Runtime GenAI loads: locally, and from a job through the server;
// refusals come before anything runs.
TEST_F(DeliveryTest, ADecoderBecomesTheFolderOnnxRuntimeGenaiLoads) {
  const std::string decoder = FixturePath("cache/trained_decoder.onnx").string();
  const std::string tokenizer = FixturePath("cache/trained_decoder_hf").string();
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"iterations": 5}})");
  const fs::path local = dir_ / "local-genai";
  const std::vector<std::string> optimize = {"optimize",  decoder, "-o", local.string() + "/", "--config",
                                             config.string(), "--layout", "genai", "--tokenizer", tokenizer};
  Result result = Cli(optimize);
  ASSERT_EQ(result.code, 0) << result.err << result.out;
  EXPECT_TRUE(absl::StrContains(result.out, "genai folder:    " + local.string() + "\n")) << result.out;
  for (const char* file : {"model.onnx", "genai_config.json", "tokenizer.json", "tokenizer_config.json",
                           "onnxopt_report.json"}) {
    EXPECT_TRUE(fs::exists(local / file)) << file;
  }
  const std::string genai = Slurp(local / "genai_config.json");
  EXPECT_TRUE(absl::StrContains(genai, "\"type\": \"qwen2\"")) << genai;
  EXPECT_TRUE(absl::StrContains(genai, "\"num_attention_heads\": 4")) << "the fused attention's heads: " << genai;
  EXPECT_TRUE(absl::StrContains(genai, "\"past_key_names\": \"past_key_values.%d.key\"")) << genai;
  EXPECT_TRUE(absl::StrContains(result.err, "genai_config.json: pad_token_id")) << result.err;
  const auto model = ParseModelFile(local / "model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  bool fused = false;
  for (const auto& node : model->graph().node()) fused |= node.op_type() == "GroupQueryAttention";
  EXPECT_TRUE(fused) << "the optimized decoder is what the folder holds";

  // Never into a folder that holds something; flags of other layouts refused; checked before running.
  Result again = Cli(optimize);
  EXPECT_EQ(again.code, 5) << again.err;
  EXPECT_TRUE(absl::StrContains(again.err, "GENAI_FOLDER_EXISTS")) << again.err;
  EXPECT_FALSE(absl::StrContains(again.out, "transformer:")) << "refused before the job ran: " << again.out;
  Result mixed = Cli({"optimize", decoder, "-o", (dir_ / "mixed").string(), "--layout", "genai", "--model-name", "m"});
  EXPECT_EQ(mixed.code, 5) << mixed.err;
  EXPECT_TRUE(absl::StrContains(mixed.err, "--model-name is for --layout triton or kserve")) << mixed.err;
  Result encoder = Cli({"optimize", FixturePath("bert_tiny.onnx").string(), "-o", (dir_ / "bert").string(),
                        "--layout", "genai", "--context-length", "128"});
  EXPECT_EQ(encoder.code, 5) << encoder.err;
  EXPECT_TRUE(absl::StrContains(encoder.err, "GENAI_UNSUPPORTED")) << encoder.err;
  EXPECT_FALSE(fs::exists(dir_ / "bert"));
  Result untold = Cli({"optimize", decoder, "-o", (dir_ / "untold").string(), "--layout", "genai"});
  EXPECT_EQ(untold.code, 5) << untold.err;
  EXPECT_TRUE(absl::StrContains(untold.err, "--context-length")) << untold.err;

  // Through the server: submit, wait, and the folder appears whole beside nothing else.
  StartServer();
  const fs::path served = dir_ / "served" / "decoder";
  Result submitted = Cli({"submit", decoder, "--config", config.string(), "--wait", "-o", served.string(), "--layout",
                          "genai", "--tokenizer", tokenizer});
  ASSERT_EQ(submitted.code, 0) << submitted.err << submitted.out;
  EXPECT_TRUE(fs::exists(served / "genai_config.json"));
  EXPECT_TRUE(fs::exists(served / "tokenizer.json"));
  for (const auto& entry : fs::directory_iterator(served.parent_path())) {
    EXPECT_EQ(entry.path(), served) << "download staging left behind";
  }
  EXPECT_EQ(StopServer(), 0);
}

// What an operator sees: the queue wait, finished jobs by reason, JSON log lines naming the job.
TEST_F(DeliveryTest, MetricsSayWhyJobsEndedAndJsonLogsNameTheJob) {
  StartServer({"--log-format=json", "--workers=1"});
  const std::string job = Submit(FixturePath("cnn_tiny.onnx"), LongJobConfig());
  ASSERT_TRUE(WaitForStatus(job, "RUNNING"));
  ASSERT_EQ(Cli({"cancel", job}).code, 0);
  ASSERT_TRUE(WaitForStatus(job, "CANCELLED"));
  // The same submit again is no retry of a cancelled job: the next id of the series runs it anew.
  const std::string again = Submit(FixturePath("cnn_tiny.onnx"), LongJobConfig());
  EXPECT_NE(again, job);
  EXPECT_EQ(Cli({"cancel", again}).code, 0);
  ASSERT_TRUE(WaitForStatus(again, "CANCELLED"));
  // A cancelled job lists no artifacts, but its report is there to read (learnt from its first chunk).
  Result report = Cli({"download", job, "--artifact", "report.json", "-o", (dir_ / "cancelled.json").string()});
  EXPECT_EQ(report.code, 0) << report.err;
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "cancelled.json"), "\"job\"")) << Slurp(dir_ / "cancelled.json");
  const std::string metrics = ScrapeMetrics(MetricsPort());
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_jobs_total{reason=\"CANCELLED\",result=\"cancelled\"} 2")) << metrics;
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_job_queue_wait_seconds_count")) << metrics;
  EXPECT_EQ(StopServer(), 0);
  int lines_about_the_job = 0;
  for (const char* file : {"server.out", "server.err"}) {
    for (absl::string_view line : absl::StrSplit(Slurp(dir_ / file), '\n', absl::SkipEmpty())) {
      EXPECT_FALSE(absl::StartsWith(line, "onnxopt-server:")) << "a text line in JSON mode: " << line;
      if (!absl::StartsWith(line, "{")) continue;  // gRPC's own log lines
      EXPECT_TRUE(absl::EndsWith(line, "}")) << "not one JSON object a line: " << line;
      EXPECT_TRUE(absl::StrContains(line, "\"time\":\"") && absl::StrContains(line, "\"level\":\"")) << line;
      if (absl::StrContains(line, absl::StrCat("\"job\":\"", job, "\""))) ++lines_about_the_job;
    }
  }
  EXPECT_GE(lines_about_the_job, 3) << "queued, started, cancelled";
}

TEST_F(DeliveryTest, PassesAreListedWithoutAServer) {
  const pid_t pid = Spawn({ONNXOPT_CLI_BIN, "passes"}, dir_ / "passes.out", dir_ / "passes.err", dir_,
                          {"ONNXOPT_SERVER="});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitFor(pid, std::chrono::seconds(30)), 0) << Slurp(dir_ / "passes.err");
  const std::string out = Slurp(dir_ / "passes.out");
  EXPECT_TRUE(absl::StrContains(out, "this onnxopt's passes")) << out;
  EXPECT_TRUE(absl::StrContains(out, "fuse_attention")) << out;
}

// `submit --wait`: the server dies with the job running and comes back; the CLI reconnects, the job
// runs again (its lease is gone with the process) and the CLI delivers the file.
TEST_F(DeliveryTest, SubmitWaitFinishesThroughAServerKilledAndRestarted) {
  StartServer();
  const fs::path config = WriteFile("slow.json", R"({"benchmark": {"iterations": 1500, "warmup_runs": 1}})");
  const fs::path out = dir_ / "out" / "bert.onnx";
  const pid_t cli = Spawn({ONNXOPT_CLI_BIN, "--server", address_, "submit", FixturePath("bert_tiny.onnx").string(),
                           "--config", config.string(), "--wait", "-o", out.string(), "--timeout", "240"},
                          dir_ / "wait.out", dir_ / "wait.err", dir_);
  ASSERT_GT(cli, 0);
  client::Client client(address_);
  bool running = false;
  for (int i = 0; i < 600 && !running; ++i) {
    auto page = client.ListJobs(v1::RUNNING, 10, "");
    running = page.ok() && page->jobs_size() > 0 && page->jobs(0).progress().phase() == v1::PHASE_BENCHMARKING;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(running) << Slurp(dir_ / "wait.err");
  KillAndRestart();
  ASSERT_EQ(WaitFor(cli, std::chrono::seconds(240)), 0) << Slurp(dir_ / "wait.err") << Slurp(dir_ / "server.err");
  EXPECT_TRUE(fs::exists(out));
  EXPECT_TRUE(fs::exists(out.string() + ".report.json"));
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "wait.out"), "optimized model: " + out.string()));
  auto jobs = client.ListJobs(v1::SUCCEEDED, 10, "");  // it reached the server before: it retries the restart
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->jobs_size(), 1);
  EXPECT_EQ(jobs->jobs(0).attempts(), 2) << "the killed attempt and the one that finished";
}

// A download the server's restart breaks resumes from the bytes already held.
TEST_F(DeliveryTest, ADownloadResumesWhereTheRestartBrokeIt) {
  StartServer();
  ExpectADownloadResumesThrough([&] { KillAndRestart(); });
}

// The same through a drain (SIGTERM), which must not wait for a stream whose client has stopped reading.
TEST_F(DeliveryTest, ADownloadResumesWhereADrainBrokeIt) {
  StartServer({"--drain-grace-seconds=1"});
  ExpectADownloadResumesThrough([&] { DrainAndRestart(); });
}

// An upload a drain breaks after its first chunk resumes from what the server committed, and the blob it
// stores is the file.
TEST_F(DeliveryTest, AnUploadResumesWhereADrainBrokeIt) {
  StartServer({"--drain-grace-seconds=1"});
  const fs::path model = BigModel();
  client::Client client(address_);
  client.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  std::vector<int64_t> progress;
  bool restarted = false;
  absl::StatusOr<v1::Blob> uploaded = client.UploadFile(model, [&](int64_t done, int64_t) {
    progress.push_back(done);
    if (!restarted) {
      restarted = true;
      DrainAndRestart();
    }
  });
  ASSERT_TRUE(uploaded.ok()) << uploaded.status() << Slurp(dir_ / "server.err");
  EXPECT_TRUE(restarted);
  EXPECT_EQ(uploaded->sha256(), *Sha256OfFile(model));
  ASSERT_GE(progress.size(), 2u);
  EXPECT_EQ(progress.back(), static_cast<int64_t>(fs::file_size(model)));
  const fs::path config = WriteFile("skip.json", R"({"validation": {"skip": true}, "benchmark": {"skip": true}})");
  Result submitted = Cli({"submit", model.string(), "--config", config.string(), "--wait", "-o",
                          (dir_ / "out.onnx").string()});
  EXPECT_EQ(submitted.code, 0) << submitted.err;
}

}  // namespace
}  // namespace onnxopt::testing
