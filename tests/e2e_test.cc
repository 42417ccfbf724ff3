// End to end: the real onnxopt-server binary on a loopback port, driven by the real onnxopt CLI.
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "tests/e2e_harness.h"

#include "client/client.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/sha256.h"

namespace onnxopt {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::E2eTest;
using testing::FixturePath;
using testing::HealthStatus;
using testing::ScrapeMetrics;
using testing::Slurp;
using testing::Spawn;
using testing::WaitFor;

TEST_F(E2eTest, TransformerIsOptimizedAndTheResultMatchesInOnnxRuntime) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"preset": "basic", "benchmark": {"iterations": 10}})");
  const fs::path out = dir_ / "out" / "bert.onnx";
  Result submit = Cli({"submit", FixturePath("bert_tiny.onnx").string(), "--config", config.string(), "-o", out.string()});
  ASSERT_EQ(submit.code, 0) << submit.err << submit.out;
  EXPECT_TRUE(absl::StrContains(submit.out, "optimized model: " + out.string()));
  EXPECT_TRUE(absl::StrContains(submit.out, "nodes 261 -> ")) << submit.out;
  ASSERT_TRUE(fs::exists(out));
  ASSERT_TRUE(fs::exists(out.string() + ".report.json"));

  Result compare = Cli({"compare", FixturePath("bert_tiny.onnx").string(), out.string(), "--config", config.string()});
  EXPECT_EQ(compare.code, 0) << compare.out << compare.err;
  EXPECT_TRUE(absl::StrContains(compare.out, "PASSED"));
  EXPECT_TRUE(absl::StrContains(compare.out, "speedup")) << "compare times both models side by side";
  if (!ProviderFor(v1::DEVICE_CUDA).ok()) {  // --device reaches compare: no silent CPU run
    Result cuda = Cli({"compare", FixturePath("bert_tiny.onnx").string(), out.string(), "--device", "cuda"});
    EXPECT_EQ(cuda.code, 5) << cuda.out;
    EXPECT_TRUE(absl::StrContains(cuda.err, "CUDA_UNAVAILABLE")) << cuda.err;
  }

  const std::string job = submit.out.substr(0, submit.out.find('\n'));
  Result report = Cli({"report", job});
  EXPECT_EQ(report.code, 0);
  EXPECT_TRUE(absl::StrContains(report.out, "eliminate_identity")) << report.out;
  EXPECT_TRUE(absl::StrContains(report.out, "speedup"));
  Result json = Cli({"status", job, "--json"});
  EXPECT_TRUE(absl::StrContains(json.out, "\"state\": \"SUCCEEDED\"")) << json.out;
  EXPECT_TRUE(absl::StrContains(Cli({"list", "--state", "succeeded"}).out, job));
  EXPECT_TRUE(absl::StrContains(Cli({"passes"}).out, "eliminate_dead_nodes"));
  const std::string info = Cli({"info"}).out;
  EXPECT_TRUE(absl::StrContains(info, "ONNX Runtime   1.29"));
  EXPECT_TRUE(absl::StrContains(info, "CPUExecutionProvider: usable here")) << info;
  EXPECT_TRUE(absl::StrContains(info, "CUDAExecutionProvider: ")) << "whether CUDA runs here, and why not: " << info;

  ASSERT_GT(MetricsPort(), 0) << Slurp(dir_ / "server.out");
  const std::string metrics = ScrapeMetrics(MetricsPort());
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_jobs_total{reason=\"\",result=\"succeeded\"} 1")) << metrics;
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_job_queue_wait_seconds_count 1")) << metrics;
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_pass_duration_seconds_count{pass=\"eliminate_identity\"}"));
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_upload_bytes_total"));
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_build_info{"));
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_execution_provider_usable{provider=\"CPUExecutionProvider\"} 1"));
  EXPECT_TRUE(absl::StrContains(metrics, "onnxopt_execution_provider_usable{provider=\"CUDAExecutionProvider\"}"));
  EXPECT_EQ(StopServer(), 0);
}

// --help lists the server's own flags with their defaults (abseil only lists those of files named
// like the program unless told otherwise).
TEST_F(E2eTest, ServerHelpListsItsFlags) {
  const pid_t pid = Spawn({ONNXOPT_SERVER_BIN, "--help"}, dir_ / "help.out", dir_ / "help.err");
  ASSERT_GT(pid, 0);
  WaitFor(pid, std::chrono::seconds(30));
  const std::string help = Slurp(dir_ / "help.out") + Slurp(dir_ / "help.err");
  for (const char* flag : {"--listen (default", "--workers", "--data-dir", "--job-memory-limit-mb", "--tls-cert",
                           "--upload-expiry-hours"}) {
    EXPECT_TRUE(absl::StrContains(help, flag)) << flag << " missing from:\n" << help;
  }
  EXPECT_FALSE(absl::StrContains(help, "No flags matched"));
}

// No config: the `auto` preset fuses the example transformer. Flags over a config file, --json as one
// JSON document a pipeline can parse, per-command help.
TEST_F(E2eTest, DefaultsFuseAndFlagsAndJsonWorkForPipelines) {
  StartServer();
  const fs::path out = dir_ / "auto" / "bert.onnx";
  Result plain = Cli({"submit", FixturePath("bert_tiny.onnx").string(), "-o", out.string()});
  ASSERT_EQ(plain.code, 0) << plain.err << plain.out;
  const std::string job = plain.out.substr(0, plain.out.find('\n'));
  Result report = Cli({"report", job});
  EXPECT_TRUE(absl::StrContains(report.out, "pipeline: auto: transformer (bert)")) << report.out;
  EXPECT_TRUE(absl::StrContains(report.out, "fully fused")) << report.out;

  // The file says basic and sequence 8; the flags say transformer and sequence 24, and win.
  const fs::path config = WriteFile("config.json", R"({"preset": "basic", "validation": {"dimValues": {"sequence": 8}},
                                                       "benchmark": {"iterations": 10}})");
  Result json = Cli({"submit", FixturePath("bert_tiny.onnx").string(), "--config", config.string(), "--preset",
                     "transformer", "--dim", "sequence=24", "--dim", "batch=2", "--json", "--wait", "-o",
                     (dir_ / "json" / "bert.onnx").string()});
  ASSERT_EQ(json.code, 0) << json.err << json.out;
  google::protobuf::Struct document;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &document).ok()) << "one JSON document:\n" << json.out;
  const auto& fields = document.fields();
  ASSERT_TRUE(fields.count("job") && fields.count("report")) << json.out;
  EXPECT_EQ(fields.at("job").struct_value().fields().at("state").string_value(), "SUCCEEDED");
  EXPECT_EQ(fields.at("report").struct_value().fields().at("pipeline").string_value(), "transformer");
  const auto& shapes = fields.at("report").struct_value().fields().at("parity").struct_value().fields().at("input_shapes");
  EXPECT_EQ(shapes.struct_value().fields().at("input_ids").string_value(), "2x24") << "the --dim values reach validation";

  Result queued = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--json", "--dim", "batch=x"});
  EXPECT_EQ(queued.code, 2) << "a malformed --dim is a usage error, before anything is uploaded";
  EXPECT_TRUE(absl::StrContains(queued.err, "--dim: use NAME=N with N >= 0")) << queued.err;
  Result negative = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--json", "--dim", "batch=-1"});
  EXPECT_EQ(negative.code, 2) << negative.err;
  EXPECT_TRUE(absl::StrContains(negative.err, "N >= 0")) << "one rule, one message: " << negative.err;
  Result download = Cli({"download", job, "-o", (dir_ / "again.onnx").string(), "--json"});
  ASSERT_EQ(download.code, 0) << download.err;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(download.out, &document).ok()) << download.out;
  EXPECT_EQ(document.fields().at("model").string_value(), (dir_ / "again.onnx").string());

  // Newcomers' trips: the version, a missing model (the error only, no empty report), compare's own flags.
  Result version = Cli({"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_TRUE(absl::StartsWith(version.out, "onnxopt 0.")) << version.out;
  EXPECT_TRUE(absl::StrContains(version.out, "ONNX Runtime 1.")) << version.out;
  Result missing = Cli({"optimize", (dir_ / "nowhere.onnx").string(), "-o", (dir_ / "x.onnx").string(), "--json"});
  EXPECT_EQ(missing.code, 5) << missing.err;
  EXPECT_EQ(missing.out, "") << "no report for a model that never loaded";
  EXPECT_TRUE(absl::StrContains(missing.err, "NOT_FOUND")) << missing.err;
  Result compare_help = Cli({"compare", "--help"});
  EXPECT_TRUE(absl::StrContains(compare_help.out, "--device")) << compare_help.out;
  EXPECT_FALSE(absl::StrContains(compare_help.out, "--precision")) << "compare reads no precision";
  Result help = Cli({"submit", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(absl::StrContains(help.out, "--preset NAME")) << help.out;
  EXPECT_TRUE(absl::StrContains(help.out, "--dim NAME=N")) << help.out;
  EXPECT_EQ(Cli({"list", "--page-size", "0"}).code, 2) << "typed options are checked";
  EXPECT_FALSE(absl::StrContains(help.out, "  status JOB")) << "only submit's lines";
  EXPECT_EQ(StopServer(), 0);
}

// TLS on the gRPC port, and mutual TLS: the CLI verifies the server with --tls-ca (or
// $ONNXOPT_TLS_CA), presents --tls-cert/--tls-key where the server requires a client certificate,
// and a client without them is refused. Certificates from openssl, made here.
TEST_F(E2eTest, TlsAndMutualTls) {
  const std::string d = dir_.string();
  const fs::path script = WriteFile("certs.sh", R"(set -e
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=onnxopt-test-ca
for who in server client; do
  openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj /CN=localhost
  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 2 -extfile san.ext
done
)");
  ASSERT_EQ(std::system(absl::StrCat("cd '", d, "' && bash '", script.string(), "' >certs.log 2>&1").c_str()), 0)
      << Slurp(dir_ / "certs.log");
  const std::string ca = d + "/ca.pem";

  // A certificate without its key is refused at start (the old underscore spelling still parses,
  // with a note).
  const pid_t bad = Spawn({ONNXOPT_SERVER_BIN, "--listen=127.0.0.1:0", "--metrics_listen=", "--tls_cert=" + d + "/server.pem",
                           absl::StrCat("--data_dir=", d, "/bad")},
                          dir_ / "bad.out", dir_ / "bad.err");
  EXPECT_NE(WaitFor(bad, std::chrono::seconds(30)), 0);
  const std::string bad_err = Slurp(dir_ / "bad.err");
  EXPECT_TRUE(absl::StrContains(bad_err, "TLS needs both --tls-cert and --tls-key")) << bad_err;
  EXPECT_TRUE(absl::StrContains(bad_err, "--tls_cert is deprecated: spell it --tls-cert")) << bad_err;

  StartServer({"--tls-cert=" + d + "/server.pem", "--tls-key=" + d + "/server.key"});
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "server.out"), ", TLS"));
  Result verified = Cli({"--tls-ca", ca, "info"});
  EXPECT_EQ(verified.code, 0) << verified.err;
  EXPECT_TRUE(absl::StrContains(verified.out, "onnxopt-server"));
  EXPECT_EQ(Cli({"info"}, {"ONNXOPT_TLS_CA=" + ca}).code, 0) << "the CA from the environment";
  EXPECT_EQ(Cli({"info"}).code, 3) << "plaintext against a TLS port fails as unreachable";
  EXPECT_EQ(StopServer(), 0);

  StartServer({"--tls-cert=" + d + "/server.pem", "--tls-key=" + d + "/server.key", "--tls-client-ca=" + ca});
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "server.out"), ", mutual TLS"));
  EXPECT_EQ(Cli({"--tls-ca", ca, "info"}).code, 3) << "no client certificate: refused";
  const std::vector<std::string> mtls = {"--tls-ca", ca, "--tls-cert", d + "/client.pem", "--tls-key", d + "/client.key"};
  std::vector<std::string> submit = mtls;
  for (const std::string& arg : {std::string("submit"), FixturePath("cnn_tiny.onnx").string(), std::string("--preset"),
                                 std::string("basic"), std::string("-o"), d + "/out/cnn.onnx"}) {
    submit.push_back(arg);
  }
  Result job = Cli(submit);
  EXPECT_EQ(job.code, 0) << job.err << job.out;
  EXPECT_TRUE(fs::exists(d + "/out/cnn.onnx")) << "upload, watch and download over mutual TLS";
  std::vector<std::string> half = {"--tls-ca", ca, "--tls-cert", d + "/client.pem", "info"};
  EXPECT_EQ(Cli(half).code, 5) << "a certificate without its key is refused by the CLI";
  EXPECT_EQ(StopServer(), 0);
}

TEST_F(E2eTest, VisionAndExternalDataModels) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"iterations": 5}})");
  for (const char* model : {"cnn_tiny.onnx", "mlp_external/model.onnx"}) {
    const fs::path out = dir_ / (std::string(model).substr(0, 3) + ".onnx");
    Result submit = Cli({"submit", FixturePath(model).string(), "--config", config.string(), "-o", out.string()});
    ASSERT_EQ(submit.code, 0) << model << ": " << submit.err;
    Result compare = Cli({"compare", FixturePath(model).string(), out.string(), "--config", config.string()});
    EXPECT_EQ(compare.code, 0) << model << ": " << compare.out << compare.err;
  }
  // The external model's big weights stayed by reference in the job and came back in a data file
  // named after the output, which the downloaded model names.
  EXPECT_TRUE(fs::exists(dir_ / "mlp.onnx.data"));
  EXPECT_FALSE(fs::exists(dir_ / "model.onnx.data"));
}

// A finished job lists each artifact with its role, which is what both clients place files by: the
// status a pipeline reads says which file is the model, its data, the report and the session settings.
TEST_F(E2eTest, EveryArtifactIsListedWithItsRole) {
  StartServer();
  const fs::path config = WriteFile("tuned.json", R"({"benchmark": {"iterations": 5, "tune_session": true}})");
  const fs::path out = dir_ / "mlp.onnx";
  Result submit = Cli({"submit", FixturePath("mlp_external/model.onnx").string(), "--config", config.string(), "--wait",
                       "--json", "-o", out.string()});
  ASSERT_EQ(submit.code, 0) << submit.err << submit.out;
  const size_t at = submit.out.find("jobs/");
  ASSERT_NE(at, std::string::npos) << submit.out;
  const std::string job = submit.out.substr(at, submit.out.find('"', at) - at);
  Result status = Cli({"status", job, "--json"});
  ASSERT_EQ(status.code, 0) << status.err;
  v1::Job parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(status.out, &parsed).ok()) << status.out;
  std::map<std::string, v1::ArtifactRole> roles;
  for (const auto& artifact : parsed.result().artifacts()) roles[artifact.name()] = artifact.role();
  const std::map<std::string, v1::ArtifactRole> expected = {{"model.onnx", v1::ARTIFACT_MODEL},
                                                            {"model.onnx.data", v1::ARTIFACT_MODEL_DATA},
                                                            {"report.json", v1::ARTIFACT_REPORT},
                                                            {"ort_session.json", v1::ARTIFACT_SESSION_SETTINGS}};
  EXPECT_EQ(roles, expected) << status.out;
  // Placed by role: the model at OUT, its data as OUT.data, the report as OUT.report.json.
  EXPECT_TRUE(fs::exists(out));
  EXPECT_TRUE(fs::exists(dir_ / "mlp.onnx.data"));
  EXPECT_TRUE(fs::exists(dir_ / "mlp.onnx.report.json"));
  EXPECT_TRUE(fs::exists(dir_ / "ort_session.json"));
}

// A decoder exported with a key/value cache: the job fuses its cached attention, times prefill and decode
// steps, runs a greedy generation with both models and reports it; compare does the same locally.
TEST_F(E2eTest, CacheDecoderJobReportsGeneration) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"preset": "transformer", "benchmark": {"iterations": 5,
      "generation": {"batchSizes": [1, 2], "prefillTokens": 16, "decodePast": [32], "greedyTokens": 8, "runs": 3}}})");
  const fs::path out = dir_ / "decoder.onnx";
  const std::string model = FixturePath("cache/cache_decoder_gqa3.onnx").string();
  Result submit = Cli({"submit", model, "--config", config.string(), "-o", out.string()});
  ASSERT_EQ(submit.code, 0) << submit.err << submit.out;
  const std::string job = submit.out.substr(0, submit.out.find('\n'));
  Result report = Cli({"report", job, "--json"});
  ASSERT_EQ(report.code, 0) << report.err;
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(report.out, &parsed).ok()) << report.out;
  const auto& generation = parsed.fields().at("generation").struct_value();
  EXPECT_EQ(generation.fields().at("phases").list_value().values_size(), 4) << "prefill and decode at batch 1 and 2";
  EXPECT_TRUE(generation.fields().at("passed").bool_value()) << report.out;
  EXPECT_EQ(generation.fields().at("identical_steps").number_value(), 8);
  const fs::path html = dir_ / "decoder.html";
  ASSERT_EQ(Cli({"report", job, "--html", html.string()}).code, 0);
  EXPECT_TRUE(absl::StrContains(Slurp(html), "<h2>Generation</h2>"));

  Result compare = Cli({"compare", model, out.string(), "--config", config.string()});
  EXPECT_EQ(compare.code, 0) << compare.out << compare.err;
  EXPECT_TRUE(absl::StrContains(compare.out, "generation (key/value cache: 4 past inputs)")) << compare.out;
  EXPECT_TRUE(absl::StrContains(compare.out, "decode       2     1    32")) << compare.out;
  EXPECT_TRUE(absl::StrContains(compare.out, "8 identical from the start")) << compare.out;
}

// ids [1, 4] -> Gather(table: 2 GiB + 4 MiB of external data, a sparse file) + x [1, 4, 1024]
//   -> MatMul(W) + 2 * MatMul(MatMul(., A), B) (a LoRA branch, r = 4) -> y [1, 4, 1024]
fs::path WriteModelPastTwoGibibytes(const fs::path& dir) {
  constexpr int64_t kRows = 525312, kWidth = 1024;  // 2^31 + 2^22 bytes of float32
  fs::create_directories(dir);
  std::ofstream(dir / "table.bin", std::ios::binary).close();
  fs::resize_file(dir / "table.bin", kRows * kWidth * 4);  // zeros, no disk blocks
  onnx::GraphProto graph;
  graph.set_name("past_two_gibibytes");
  *graph.add_input() = testing::MakeValue("ids", onnx::TensorProto::INT64, {1, 4});
  *graph.add_input() = testing::FloatValue("x", {1, 4, kWidth});
  onnx::TensorProto table;
  table.set_name("table");
  table.set_data_type(onnx::TensorProto::FLOAT);
  table.add_dims(kRows);
  table.add_dims(kWidth);
  table.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add_entry = [&](const std::string& key, const std::string& value) {
    auto* entry = table.add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  };
  add_entry("location", "table.bin");
  add_entry("offset", "0");
  add_entry("length", std::to_string(kRows * kWidth * 4));
  *graph.add_initializer() = std::move(table);
  *graph.add_initializer() = testing::FloatTensor("W", {kWidth, kWidth}, testing::RandomFloats(kWidth * kWidth, 1));
  *graph.add_initializer() = testing::FloatTensor("A", {kWidth, 4}, testing::RandomFloats(kWidth * 4, 2));
  *graph.add_initializer() = testing::FloatTensor("B", {4, kWidth}, testing::RandomFloats(kWidth * 4, 3));
  *graph.add_initializer() = testing::FloatTensor("scale", {}, {2.0f});
  *graph.add_node() = testing::MakeNode("Gather", {"table", "ids"}, {"rows"});
  *graph.add_node() = testing::MakeNode("Add", {"rows", "x"}, {"h"});
  *graph.add_node() = testing::MakeNode("MatMul", {"h", "W"}, {"base"});
  *graph.add_node() = testing::MakeNode("MatMul", {"h", "A"}, {"down"});
  *graph.add_node() = testing::MakeNode("MatMul", {"down", "B"}, {"up"});
  *graph.add_node() = testing::MakeNode("Mul", {"up", "scale"}, {"scaled"});
  *graph.add_node() = testing::MakeNode("Add", {"base", "scaled"}, {"y"});
  *graph.add_output() = testing::FloatValue("y", {1, 4, kWidth});
  const fs::path path = dir / "model.onnx";
  std::ofstream(path, std::ios::binary) << testing::MakeModel(std::move(graph)).SerializeAsString();
  return path;
}

// Past protobuf's 2 GiB through the server: the upload of the model and its data file, the job (the
// adapter extracted and checked through ONNX Runtime's adapter API, validation, the benchmark, the
// lineage), the download, and a second submission served from the result cache, whose key reads the
// data file too. Nothing fails on protobuf's size limit. About a minute: the 2 GiB are hashed, sent,
// written and read back several times.
TEST_F(E2eTest, AModelPastTwoGibibytesUploadsExtractsItsAdapterAndIsServedFromTheResultCache) {
  const fs::path model = WriteModelPastTwoGibibytes(dir_ / "big");
  ASSERT_GT(fs::file_size(dir_ / "big" / "table.bin"), uint64_t{2} << 30);
  StartServer();
  const fs::path config = WriteFile("big.json", R"({"preset": "basic", "passesBefore": [{"name": "extract_adapters"}],
      "benchmark": {"iterations": 5, "warmup_runs": 1}})");
  const fs::path out = dir_ / "out" / "big.onnx";
  fs::create_directories(out.parent_path());
  Result first = Cli({"submit", model.string(), "--config", config.string(), "--wait", "--json", "-o", out.string()});
  ASSERT_EQ(first.code, 0) << first.err << first.out;
  const std::string job = first.out.substr(first.out.find("jobs/"), first.out.find('"', first.out.find("jobs/")) -
                                                                        first.out.find("jobs/"));
  const std::string report = Cli({"report", job, "--json"}).out;
  EXPECT_FALSE(absl::StrContains(report, "protobuf")) << report;
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(report, &parsed).ok()) << report;
  const auto& adapter = parsed.fields().at("adapter").struct_value().fields();
  EXPECT_EQ(adapter.at("modules").list_value().values_size(), 1);
  EXPECT_TRUE(adapter.at("parity").struct_value().fields().at("passed").bool_value()) << report;
  EXPECT_TRUE(parsed.fields().at("parity").struct_value().fields().at("passed").bool_value()) << report;
  EXPECT_TRUE(fs::exists(out.parent_path() / "big.onnx_adapter"));
  EXPECT_GT(fs::file_size(out.string() + ".data"), uint64_t{2} << 30) << "the table came back in a data file";

  // Another priority: another request (the same one would be the same job), the same result.
  const fs::path urgent = WriteFile("urgent.json", R"({"preset": "basic", "passesBefore": [{"name": "extract_adapters"}],
      "benchmark": {"iterations": 5, "warmup_runs": 1}, "priority": 5})");
  Result again = Cli({"submit", model.string(), "--config", urgent.string(), "--json"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(absl::StrContains(again.out, absl::StrCat("\"cached_from\": \"", job, "\""))) << again.out;
}

// LoRA: the job extracts the adapters (model.onnx_adapter beside the model, checked through ONNX
// Runtime's adapter API), a peft checkpoint of another adapter converts for the result, and swapped in
// at run time it gives what the model rebuilt with it gives.
TEST_F(E2eTest, LoraAdaptersLeaveTheModelAndSwapAtRunTime) {
  StartServer();
  const fs::path config = WriteFile("lora.json", R"({"preset": "transformer", "passesBefore": [{"name":
      "extract_adapters"}], "benchmark": {"iterations": 5}})");
  const fs::path out = dir_ / "bert.onnx";
  Result submit = Cli({"submit", FixturePath("lora/bert_r4.onnx").string(), "--config", config.string(), "-o",
                       out.string()});
  ASSERT_EQ(submit.code, 0) << submit.err << submit.out;
  ASSERT_TRUE(fs::exists(dir_ / "bert.onnx_adapter"));
  const std::string job = submit.out.substr(0, submit.out.find('\n'));
  Result report = Cli({"report", job, "--json"});
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(report.out, &parsed).ok()) << report.out;
  const auto& adapter = parsed.fields().at("adapter").struct_value().fields();
  EXPECT_EQ(adapter.at("modules").list_value().values_size(), 10);
  EXPECT_TRUE(adapter.at("parity").struct_value().fields().at("passed").bool_value()) << report.out;
  EXPECT_GT(adapter.at("base_max_abs_diff").number_value(), 1e-3) << "the adapter acts";
  EXPECT_TRUE(absl::StrContains(Cli({"report", job}).out, "adapter  model.onnx_adapter: 10 modules"));
  const fs::path html = dir_ / "lora.html";
  ASSERT_EQ(Cli({"report", job, "--html", html.string()}).code, 0);
  EXPECT_TRUE(absl::StrContains(Slurp(html), "<h2>LoRA adapter</h2>"));
  const fs::path fetched = dir_ / "fetched.onnx_adapter";
  ASSERT_EQ(Cli({"download", job, "--artifact", "model.onnx_adapter", "-o", fetched.string()}).code, 0);
  EXPECT_EQ(Slurp(fetched), Slurp(dir_ / "bert.onnx_adapter"));

  const fs::path second = dir_ / "second.onnx_adapter";
  Result convert = Cli({"adapters", "convert", FixturePath("lora/bert_r4_second").string(), "--model", out.string(),
                        "-o", second.string()});
  ASSERT_EQ(convert.code, 0) << convert.err;
  Result swapped = Cli({"compare", FixturePath("lora/bert_r4_second.onnx").string(), out.string(), "--adapter",
                        second.string()});
  EXPECT_EQ(swapped.code, 0) << swapped.out << swapped.err;
  Result crossed = Cli({"compare", FixturePath("lora/bert_r4.onnx").string(), out.string(), "--adapter",
                        second.string()});
  EXPECT_EQ(crossed.code, 1) << "the second adapter is not the first";

  Result foreign = Cli({"adapters", "convert", FixturePath("lora/llama_r6_first").string(), "--model", out.string(),
                        "-o", (dir_ / "foreign.onnx_adapter").string()});
  EXPECT_EQ(foreign.code, 5);
  EXPECT_TRUE(absl::StrContains(foreign.err, "ADAPTER_MISMATCH")) << foreign.err;
  EXPECT_FALSE(fs::exists(dir_ / "foreign.onnx_adapter"));
  const fs::path cut = WriteFile("cut.onnx_adapter", Slurp(second).substr(0, 100));
  Result truncated = Cli({"compare", FixturePath("lora/bert_r4.onnx").string(), out.string(), "--adapter", cut.string()});
  EXPECT_EQ(truncated.code, 5);
  EXPECT_TRUE(absl::StrContains(truncated.err, "ADAPTER_INVALID")) << truncated.err;
}

TEST_F(E2eTest, CancelStopsARunningJob) {
  StartServer();
  const std::string job = Submit(FixturePath("bert_tiny.onnx"), LongJobConfig());
  ASSERT_TRUE(WaitForStatus(job, "benchmarking"));
  Result cancel = Cli({"cancel", job});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  Result watch = Cli({"watch", job});
  EXPECT_EQ(watch.code, 4) << watch.out << watch.err;
  EXPECT_TRUE(absl::StrContains(Cli({"status", job}).out, "CANCELLED"));
  Result download = Cli({"download", job, "-o", (dir_ / "x.onnx").string()});
  EXPECT_EQ(download.code, 5) << "no model for a cancelled job";
}

TEST_F(E2eTest, BadInputsGetClearErrorsAndTheServerKeepsServing) {
  StartServer();
  // A checksum that does not match the bytes: DATA_LOSS, nothing stored.
  auto stub = v1::Optimizer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  const std::string claimed = Sha256OfBytes("the real model");
  {
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = stub->UploadBlob(&context, &blob);
    v1::UploadBlobRequest chunk;
    chunk.set_sha256(claimed);
    chunk.set_total_size(8);
    chunk.set_data("tampered");
    chunk.set_finish_write(true);
    writer->Write(chunk);
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
    EXPECT_TRUE(absl::StrContains(status.error_message(), "CHECKSUM_MISMATCH"));
  }
  onnxopt::client::Client client(address_);
  v1::ModelRef missing;
  missing.set_sha256(claimed);
  EXPECT_EQ(client.CreateJob(missing, {}).status().code(), absl::StatusCode::kNotFound);

  Result garbage = Cli({"submit", WriteFile("garbage.onnx", std::string(4096, '\x07')).string()});
  EXPECT_EQ(garbage.code, 5);
  EXPECT_TRUE(absl::StrContains(garbage.err, "MODEL_PARSE_FAILED")) << garbage.err;

  // Bytes that parse locally but are not a model the server accepts: uploaded raw, refused at CreateJob.
  auto blob = client.UploadFile(WriteFile("empty.onnx", ""));
  ASSERT_TRUE(blob.ok()) << blob.status();
  v1::ModelRef empty;
  empty.set_sha256(blob->sha256());
  auto refused = client.CreateJob(empty, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);

  Result bad_config = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config",
                           WriteFile("bad.json", R"({"preset": "turbo"})").string()});
  EXPECT_EQ(bad_config.code, 5);
  EXPECT_TRUE(absl::StrContains(bad_config.err, "unknown preset 'turbo'")) << bad_config.err;
  Result unknown_field = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config",
                              WriteFile("typo.json", R"({"presett": "basic"})").string()});
  EXPECT_EQ(unknown_field.code, 5);

  Result unknown_job = Cli({"status", "jobs/does-not-exist"});
  EXPECT_EQ(unknown_job.code, 5);
  EXPECT_TRUE(absl::StrContains(unknown_job.err, "NOT_FOUND"));
  EXPECT_EQ(Cli({"frobnicate"}).code, 2);

  // Hostile or malformed requests straight at the API.
  {
    grpc::ClientContext context;
    v1::DownloadRequest request;
    request.set_name("jobs/x");
    request.set_artifact("../../jobs.sqlite3");
    auto reader = stub->Download(&context, request);
    v1::DownloadChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    v1::ModelRef traversal;
    auto model_blob = client.UploadFile(FixturePath("cnn_tiny.onnx"));
    ASSERT_TRUE(model_blob.ok());
    traversal.set_sha256(model_blob->sha256());
    auto* file = traversal.add_external_data();
    file->set_name("../../escape.bin");
    file->set_sha256(model_blob->sha256());
    auto job = client.CreateJob(traversal, {});
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(job.status().message(), "EXTERNAL_DATA_PATH")) << job.status();
  }
  {
    grpc::ClientContext context;
    v1::Blob blob;
    auto writer = stub->UploadBlob(&context, &blob);
    v1::UploadBlobRequest chunk;
    chunk.set_sha256(Sha256OfBytes("0123456789"));
    chunk.set_total_size(10);
    chunk.set_data("01234");
    writer->Write(chunk);
    writer->WritesDone();  // ends without finish_write
    grpc::Status status = writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_TRUE(absl::StrContains(status.error_message(), "UPLOAD_INCOMPLETE"));
  }
  {
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    request.set_page_size(-1);
    v1::ListJobsResponse response;
    EXPECT_EQ(stub->ListJobs(&context, request, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(Cli({"watch", "jobs/nope"}).code, 5);

  EXPECT_EQ(Cli({"info"}).code, 0) << "still serving";
  EXPECT_EQ(StopServer(), 0);
}

TEST_F(E2eTest, FullQueueAnswersResourceExhausted) {
  StartServer({"--workers=1", "--queue-capacity=1"});
  const fs::path config = LongJobConfig();
  const std::string running = Submit(FixturePath("bert_tiny.onnx"), config);
  ASSERT_TRUE(WaitForStatus(running, "RUNNING"));
  const std::string queued = Submit(FixturePath("cnn_tiny.onnx"), config);
  // Another request (the same model and config would be the queued job's retry: its default request id).
  Result full = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--request-id", "b"});
  EXPECT_EQ(full.code, 3) << full.err;
  EXPECT_TRUE(absl::StrContains(full.err, "QUEUE_FULL")) << full.err;
  EXPECT_EQ(Cli({"cancel", queued}).code, 0);
  EXPECT_TRUE(absl::StrContains(Cli({"status", queued}).out, "CANCELLED"));
  EXPECT_EQ(Cli({"cancel", running}).code, 0);
  EXPECT_EQ(Cli({"watch", running}).code, 4);
}

// Each job runs in its own worker process: a job that blows its memory or time limit fails alone.
TEST_F(E2eTest, JobsOverTheirLimitsFailAloneAndTheServerKeepsServing) {
  StartServer({"--job-memory-limit-mb=40"});
  Result starved = Cli({"submit", FixturePath("bert_tiny.onnx").string(), "--wait", "-o", (dir_ / "a.onnx").string()});
  EXPECT_EQ(starved.code, 1) << starved.out << starved.err;
  EXPECT_TRUE(absl::StrContains(starved.err, "FAILED")) << starved.err;
  EXPECT_FALSE(fs::exists(dir_ / "a.onnx"));
  EXPECT_EQ(Cli({"info"}).code, 0);
  EXPECT_EQ(StopServer(), 0);

  // The limit leaves a quick job room on a loaded CI machine (a 2 s limit once cut cnn_tiny's job off at 3.8 s
  // while the soak test shared the two cores); the long job still runs far past it.
  StartServer({"--job-timeout-seconds=8"});
  Result slow = Cli({"submit", FixturePath("bert_tiny.onnx").string(), "--config", LongJobConfig().string(), "--wait"});
  EXPECT_EQ(slow.code, 1) << slow.out << slow.err;
  EXPECT_TRUE(absl::StrContains(slow.err, "JOB_TIMEOUT")) << slow.err;
  const fs::path quick = WriteFile("quick.json", R"({"benchmark": {"skip": true}})");
  Result after = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", quick.string(), "--wait",
                      "-o", (dir_ / "c.onnx").string()});
  EXPECT_EQ(after.code, 0) << after.err;
}

TEST_F(E2eTest, RequestIdMakesRetriesReturnTheSameJob) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"skip": true}})");
  Result first = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--request-id", "r-1"});
  Result second = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--request-id", "r-1"});
  ASSERT_EQ(first.code, 0);
  ASSERT_EQ(second.code, 0);
  EXPECT_EQ(first.out, second.out);
}

TEST_F(E2eTest, DrainKeepsUnfinishedJobsForTheNextStart) {
  StartServer({"--workers=1", "--drain-grace-seconds=3"});
  const std::string running = Submit(FixturePath("bert_tiny.onnx"), LongJobConfig());
  ASSERT_TRUE(WaitForStatus(running, "RUNNING"));
  const std::string waiting = Submit(FixturePath("cnn_tiny.onnx"), WriteFile("quick.json", R"({"benchmark": {"iterations": 3}})"));
  EXPECT_EQ(HealthStatus(address_, ""), 1);
  EXPECT_EQ(HealthStatus(address_, "onnxopt.v1.Optimizer"), 1);
  // SIGTERM: while the running job has its grace period, health says NOT_SERVING and new work is refused.
  kill(server_, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  int health = 1;
  while (health == 1 && Clock::now() < deadline) health = HealthStatus(address_, "onnxopt.v1.Optimizer");
  EXPECT_EQ(health, 2);
  // (The CLI retries UNAVAILABLE, which behind a Service reaches another replica: here its deadline ends it.)
  Result refused = Cli({"--timeout", "1", "submit", FixturePath("cnn_tiny.onnx").string()});
  EXPECT_EQ(refused.code, 3) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "DRAINING")) << refused.err;
  EXPECT_EQ(WaitFor(server_, std::chrono::seconds(60)), 0) << Slurp(dir_ / "server.err");
  server_ = -1;
  EXPECT_TRUE(absl::StrContains(Slurp(dir_ / "server.out"), "queued job(s) kept for the next start"));

  StartServer({"--workers=1"});
  // The interrupted job runs again, the waiting one after it.
  ASSERT_TRUE(WaitForStatus(running, "RUNNING"));
  EXPECT_TRUE(absl::StrContains(Cli({"status", waiting}).out, "QUEUED"));
  EXPECT_EQ(Cli({"cancel", running}).code, 0);
  Result watch = Cli({"watch", waiting});
  EXPECT_EQ(watch.code, 0) << watch.out << watch.err;
  EXPECT_EQ(StopServer(), 0);
}

// Real inputs in ONNX's test data layout go up with the model; the report says they were used.
// Tensors that do not fit the model fail the job with the reason; files that are no tensors are
// refused by the CLI before anything is sent.
TEST_F(E2eTest, SuppliedInputsValidateTheModel) {
  StartServer();
  for (int set = 0; set < 2; ++set) {
    const fs::path folder = dir_ / "inputs" / absl::StrCat("test_data_set_", set);
    fs::create_directories(folder);
    const onnx::TensorProto image = MakeFloatTensor("image", {3, 3, 32, 32}, testing::RandomFloats(3 * 3 * 32 * 32, set));
    std::ofstream(folder / "input_0.pb", std::ios::binary) << image.SerializeAsString();
  }
  const fs::path config = WriteFile("config.json", R"({"benchmark": {"iterations": 5}})");
  const fs::path out = dir_ / "out" / "cnn.onnx";
  Result submit = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--config", config.string(), "--inputs",
                       (dir_ / "inputs").string(), "-o", out.string()});
  ASSERT_EQ(submit.code, 0) << submit.err << submit.out;
  const std::string job = submit.out.substr(0, submit.out.find('\n'));
  Result report = Cli({"report", job, "--json"});
  EXPECT_TRUE(absl::StrContains(report.out, "\"supplied_inputs\": true")) << report.out;
  EXPECT_TRUE(absl::StrContains(report.out, "\"samples\": 2")) << report.out;
  EXPECT_TRUE(absl::StrContains(report.out, "\"image\": \"3x3x32x32\"")) << report.out;

  const fs::path wrong = dir_ / "wrong";
  fs::create_directories(wrong);
  std::ofstream(wrong / "pixels.pb", std::ios::binary)
      << MakeFloatTensor("", {1, 3, 32, 32}, testing::RandomFloats(3 * 32 * 32, 9)).SerializeAsString();
  Result mismatch = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--inputs", wrong.string(), "--wait"});
  EXPECT_EQ(mismatch.code, 1) << mismatch.err;
  EXPECT_TRUE(absl::StrContains(mismatch.err, "INPUT_MISMATCH")) << mismatch.err;

  // The API refuses input sets that are not numbered 0..n-1 or name an input twice.
  onnxopt::client::Client client(address_);
  auto model = client.UploadModel(FixturePath("cnn_tiny.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto blob = client.UploadFile(dir_ / "inputs" / "test_data_set_0" / "input_0.pb");
  ASSERT_TRUE(blob.ok()) << blob.status();
  v1::InputTensor image;
  image.set_name("image");
  image.set_sha256(blob->sha256());
  image.set_sample(1);
  auto gap = client.CreateJob(*model, v1::OptimizationConfig(), "", {image});
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(gap.status().message(), "0 is missing")) << gap.status();
  image.set_sample(0);
  auto twice = client.CreateJob(*model, v1::OptimizationConfig(), "", {image, image});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(twice.status().message(), "given twice")) << twice.status();

  const fs::path junk = dir_ / "junk";
  fs::create_directories(junk);
  std::ofstream(junk / "image.pb", std::ios::binary) << "\xff\xff\xff not a tensor";
  Result refused = Cli({"submit", FixturePath("cnn_tiny.onnx").string(), "--inputs", junk.string()});
  EXPECT_EQ(refused.code, 5) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "INPUTS_INVALID")) << refused.err;
  EXPECT_EQ(StopServer(), 0);
}

// The transformer preset through the server: the report's table says the family is fully fused,
// `report --html` writes a page that headless Chromium renders with every chart drawn, and the
// screenshot is a real picture.
TEST_F(E2eTest, TransformerReportRendersInHeadlessChromium) {
  StartServer();
  const fs::path config = WriteFile("config.json", R"({"preset": "transformer",
      "validation": {"maskPadding": 0.25, "shapes": [{"dimValues": {"sequence": 16}}, {"dimValues": {"sequence": 64}}]},
      "benchmark": {"iterations": 40}})");
  Result submit = Cli({"submit", FixturePath("transformers/gpt2_opset17.onnx").string(), "--config", config.string(), "--wait"});
  ASSERT_EQ(submit.code, 0) << submit.err << submit.out;
  const std::string job = submit.out.substr(0, submit.out.find('\n'));
  Result table = Cli({"report", job});
  EXPECT_TRUE(absl::StrContains(table.out, "transformer: gpt2 (detected), 2 layers, 4 heads, hidden 64, fully fused"))
      << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "shape 1: attention_mask=1x64, input_ids=1x64")) << table.out;
  const fs::path html = dir_ / "report.html";
  Result written = Cli({"report", job, "--html", html.string()});
  ASSERT_EQ(written.code, 0) << written.err;
  const std::string page = Slurp(html);
  for (const char* expected : {"id=\"latency-chart-0\"", "id=\"latency-chart-1\"", "id=\"pass-chart\"", "id=\"op-chart\"",
                               "fuse_attention", "com.microsoft::Attention", "parity passed", "gpt2 fully fused"}) {
    EXPECT_TRUE(absl::StrContains(page, expected)) << expected;
  }
  EXPECT_FALSE(absl::StrContains(page, "http://")) << "self-contained";
  EXPECT_FALSE(absl::StrContains(page, "https://")) << "self-contained";

  const std::vector<std::string> chromium = {"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                             "--disable-quic", "--no-first-run", "--disable-background-networking",
                                             "--disable-component-update", "--disable-sync",
                                             absl::StrCat("--user-data-dir=", (dir_ / "chromium").string())};
  ASSERT_TRUE(fs::exists(chromium[0])) << "scripts/setup.sh installs Debian's chromium";
  std::vector<std::string> dump = chromium;
  dump.insert(dump.end(), {"--virtual-time-budget=5000", "--dump-dom", absl::StrCat("file://", html.string())});
  const pid_t dumped = Spawn(dump, dir_ / "dom.html", dir_ / "chromium.err");
  ASSERT_EQ(WaitFor(dumped, std::chrono::seconds(120)), 0) << Slurp(dir_ / "chromium.err");
  const std::string dom = Slurp(dir_ / "dom.html");
  const size_t at = dom.find("data-rendered=\"");
  ASSERT_NE(at, std::string::npos) << "the page's layout probe ran";
  const std::string rendered = dom.substr(at + 15, dom.find('"', at + 15) - at - 15);
  int charts = 0, marks = 0, drawn = 0;
  ASSERT_EQ(std::sscanf(rendered.c_str(), "charts=%d;marks=%d;drawn=%d", &charts, &marks, &drawn), 3) << rendered;
  EXPECT_EQ(charts, 4) << "two latency charts, the pass chart, the operator chart";
  EXPECT_GT(marks, 50);
  EXPECT_GE(drawn, marks * 9 / 10) << "marks laid out with a size: " << rendered;

  std::vector<std::string> shot = chromium;
  shot.insert(shot.end(), {"--window-size=1200,1800", absl::StrCat("--screenshot=", (dir_ / "report.png").string()),
                           absl::StrCat("file://", html.string())});
  const pid_t shooting = Spawn(shot, dir_ / "shot.out", dir_ / "shot.err");
  ASSERT_EQ(WaitFor(shooting, std::chrono::seconds(120)), 0) << Slurp(dir_ / "shot.err");
  const std::string png = Slurp(dir_ / "report.png");
  ASSERT_GT(png.size(), 20000u) << "a blank page compresses to a few KiB";
  EXPECT_EQ(png.substr(1, 3), "PNG");
  EXPECT_EQ(StopServer(), 0);
}

}  // namespace
}  // namespace onnxopt
