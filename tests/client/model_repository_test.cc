// Deployable output: config.pbtxt parsed with protobuf's text-format parser into the project's own
// declaration of Triton's ModelConfig fields (tests/client/triton_model_config.proto), which refuses
// any field it does not declare; the repository's layout and its immutable versions.
#include "client/model_repository.h"

#include <filesystem>
#include <fstream>

#include "client/triton_model_config.pb.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"

namespace onnxopt::client {
namespace {

namespace fs = std::filesystem;
namespace triton = onnxopt::test::triton;

void AddTensor(onnx::ValueInfoProto* value, const std::string& name, int32_t type, const std::vector<std::string>& dims) {
  value->set_name(name);
  auto* tensor = value->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(type);
  for (const std::string& dim : dims) {
    auto* d = tensor->mutable_shape()->add_dim();
    if (std::isdigit(static_cast<unsigned char>(dim[0]))) {
      d->set_dim_value(std::stoll(dim));
    } else {
      d->set_dim_param(dim);
    }
  }
}

// An encoder's interface: two int64 inputs and float logits, batch and sequence dynamic, one fused
// contrib operator; `batch` names the leading dim ("1" makes it static).
onnx::ModelProto Encoder(const std::string& batch) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  auto* opset = model.add_opset_import();
  opset->set_version(17);
  auto* microsoft = model.add_opset_import();
  microsoft->set_domain("com.microsoft");
  microsoft->set_version(1);
  onnx::GraphProto* graph = model.mutable_graph();
  AddTensor(graph->add_input(), "input_ids", onnx::TensorProto::INT64, {batch, "sequence"});
  AddTensor(graph->add_input(), "attention_mask", onnx::TensorProto::INT64, {batch, "sequence"});
  AddTensor(graph->add_output(), "logits", onnx::TensorProto::FLOAT, {batch, "sequence", "8"});
  onnx::NodeProto* node = graph->add_node();
  node->set_op_type("SkipSimplifiedLayerNormalization");
  node->set_domain("com.microsoft");
  return model;
}

v1::Report CpuReport() {
  v1::Report report;
  report.set_job("jobs/abc");
  report.set_optimizer_version("0.1.0");
  v1::BenchmarkReport* benchmark = report.mutable_benchmark();
  benchmark->set_execution_provider("CPUExecutionProvider");
  benchmark->set_intra_op_threads(2);
  benchmark->set_execution_mode("sequential");
  benchmark->set_ort_optimization_level("all");
  v1::TuningTrial* best = benchmark->mutable_tuning()->mutable_best();
  best->set_intra_op_threads(4);
  best->set_execution_mode("parallel");
  best->set_optimization_level("extended");
  best->set_p50_ms(1.5);
  return report;
}

triton::ModelConfig Parse(const std::string& text) {
  triton::ModelConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

TEST(TritonModelConfigTest, ParsesAsTritonsSchemaWithTheGraphsInterfaceAndTheTunedSettings) {
  const std::string text = TritonModelConfig(Encoder("batch"), CpuReport(), "bert", 16);
  const triton::ModelConfig config = Parse(text);
  EXPECT_EQ(config.name(), "bert");
  EXPECT_EQ(config.backend(), "onnxruntime");
  EXPECT_EQ(config.max_batch_size(), 16) << "the batch dim is dynamic: Triton batches";
  ASSERT_EQ(config.input_size(), 2);
  EXPECT_EQ(config.input(0).name(), "input_ids");
  EXPECT_EQ(config.input(0).data_type(), triton::TYPE_INT64);
  EXPECT_EQ(std::vector<int64_t>(config.input(0).dims().begin(), config.input(0).dims().end()),
            std::vector<int64_t>({-1})) << "the batch dim is left out, the sequence is -1";
  ASSERT_EQ(config.output_size(), 1);
  EXPECT_EQ(config.output(0).data_type(), triton::TYPE_FP32);
  EXPECT_EQ(std::vector<int64_t>(config.output(0).dims().begin(), config.output(0).dims().end()),
            std::vector<int64_t>({-1, 8}));
  ASSERT_EQ(config.instance_group_size(), 1);
  EXPECT_EQ(config.instance_group(0).kind(), triton::ModelInstanceGroup::KIND_CPU);
  EXPECT_TRUE(config.has_dynamic_batching());
  EXPECT_EQ(config.optimization().graph().level(), 1) << "the tuning's best level, extended, is Triton's 1";
  EXPECT_EQ(config.parameters().at("intra_op_thread_count").string_value(), "4");
  EXPECT_EQ(config.parameters().at("execution_mode").string_value(), "1");
  // SkipSimplifiedLayerNormalization's CPU kernel came with ONNX Runtime 1.16.2.
  EXPECT_EQ(config.parameters().at("onnxopt_min_onnxruntime_version").string_value(), "1.16.2");
  EXPECT_NE(text.find("# Needs ONNX Runtime >= 1.16.2 (com.microsoft::SkipSimplifiedLayerNormalization)"),
            std::string::npos) << text;
}

TEST(TritonModelConfigTest, AStaticBatchKeepsEveryDimAndCudaDeploysOnTheGpuWithItsProviderOptions) {
  v1::Report report = CpuReport();
  report.mutable_benchmark()->set_execution_provider("CUDAExecutionProvider");
  report.mutable_benchmark()->clear_tuning();
  (*report.mutable_benchmark()->mutable_deploy_settings())["cuda.enable_cuda_graph"] = "1";
  (*report.mutable_benchmark()->mutable_deploy_settings())["io_binding"] = "inputs and outputs on the device";
  const triton::ModelConfig config = Parse(TritonModelConfig(Encoder("1"), report, "bert_gpu", 8));
  EXPECT_EQ(config.max_batch_size(), 0);
  EXPECT_EQ(std::vector<int64_t>(config.input(1).dims().begin(), config.input(1).dims().end()),
            std::vector<int64_t>({1, -1}));
  EXPECT_FALSE(config.has_dynamic_batching());
  EXPECT_EQ(config.instance_group(0).kind(), triton::ModelInstanceGroup::KIND_GPU);
  ASSERT_EQ(config.optimization().execution_accelerators().gpu_execution_accelerator_size(), 1);
  const auto& cuda = config.optimization().execution_accelerators().gpu_execution_accelerator(0);
  EXPECT_EQ(cuda.name(), "cuda");
  EXPECT_EQ(cuda.parameters().at("enable_cuda_graph"), "1");
  EXPECT_EQ(cuda.parameters().count("io_binding"), 0u) << "a note, not a provider option";
  EXPECT_FALSE(config.optimization().has_graph()) << "all optimizations: Triton's default, no level written";
  EXPECT_EQ(config.parameters().at("intra_op_thread_count").string_value(), "2");
  EXPECT_EQ(config.parameters().at("execution_mode").string_value(), "0");
  // On CUDA SkipSimplifiedLayerNormalization is older (1.14); opset 17 needs 1.12.
  EXPECT_EQ(config.parameters().at("onnxopt_min_onnxruntime_version").string_value(), "1.14");
}

// A decoder's requests each carry their own key/value cache: no dynamic batching, with the reason.
TEST(TritonModelConfigTest, ADecoderWithAKeyValueCacheGetsNoDynamicBatching) {
  auto decoder = LoadModel(ONNXOPT_SOURCE_DIR "/tests/fixtures/cache/cache_decoder_gqa3.onnx");
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const std::string text = TritonModelConfig(*decoder, CpuReport(), "decoder", 8);
  const triton::ModelConfig config = Parse(text);
  EXPECT_FALSE(config.has_dynamic_batching()) << text;
  EXPECT_EQ(config.max_batch_size(), 8) << "a client may still send a batch of its own";
  EXPECT_NE(text.find("# No dynamic batching: the model takes a key/value cache"), std::string::npos) << text;
  EXPECT_TRUE(Parse(TritonModelConfig(Encoder("batch"), CpuReport(), "bert", 8)).has_dynamic_batching());
}

TEST(TritonModelConfigTest, TheParserRefusesFieldsTritonDoesNotHave) {
  triton::ModelConfig config;
  EXPECT_FALSE(google::protobuf::TextFormat::ParseFromString("name: \"x\"\nmax_batch: 4\n", &config));
  EXPECT_FALSE(google::protobuf::TextFormat::ParseFromString("input [ { name: \"a\" dims: [ 1 ] shape: 2 } ]", &config));
}

class ModelRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("onnxopt-repository-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "download");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A downloaded result: model.onnx, a data file it names, the report.
  std::vector<fs::path> Download() {
    const fs::path folder = dir_ / "download";
    EXPECT_TRUE(WriteFileAtomically(folder / "model.onnx", Encoder("batch").SerializeAsString()).ok());
    EXPECT_TRUE(WriteFileAtomically(folder / "model.onnx.data", std::string(64, '\0')).ok());
    EXPECT_TRUE(WriteFileAtomically(folder / "report.json", "{}").ok());
    return {folder / "model.onnx", folder / "model.onnx.data", folder / "report.json"};
  }

  fs::path dir_;
};

TEST_F(ModelRepositoryTest, WritesTritonsLayoutAndNeverOverwritesAVersion) {
  RepositoryOptions options;
  options.model_name = "bert";
  const fs::path repo = dir_ / "models";
  auto written = WriteModelRepository(LocalResultFiles(Download()), CpuReport(), options, repo);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_TRUE(fs::exists(repo / "bert" / "config.pbtxt"));
  EXPECT_TRUE(fs::exists(repo / "bert" / "1" / "model.onnx"));
  EXPECT_TRUE(fs::exists(repo / "bert" / "1" / "model.onnx.data"));
  EXPECT_TRUE(fs::exists(repo / "bert" / "onnxopt_report.json")) << "outside the version folder Triton loads";
  EXPECT_FALSE(fs::exists(repo / "inferenceservice.yaml"));
  for (const auto& entry : fs::directory_iterator(repo / "bert")) {
    EXPECT_NE(entry.path().filename().string().rfind(".onnxopt-", 0), 0u) << "staging left behind";
  }

  auto again = WriteModelRepository(LocalResultFiles(Download()), CpuReport(), options, repo);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("--version 2"), absl::string_view::npos) << again.status();
  options.version = 2;
  ASSERT_TRUE(WriteModelRepository(LocalResultFiles(Download()), CpuReport(), options, repo).ok());
  EXPECT_TRUE(fs::exists(repo / "bert" / "2" / "model.onnx"));
  EXPECT_TRUE(fs::exists(repo / "bert" / "1" / "model.onnx")) << "the earlier version stays";
}

TEST_F(ModelRepositoryTest, KServeAddsAnInferenceServiceWithAKubernetesName) {
  RepositoryOptions options;
  options.layout = RepositoryLayout::kKServe;
  options.model_name = "My_Bert.v2";
  options.storage_uri = "s3://models/it's \"bert\"";
  auto written = WriteModelRepository(LocalResultFiles(Download()), CpuReport(), options, dir_ / "models");
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::string> manifest = ReadFile(dir_ / "models" / "inferenceservice.yaml");
  ASSERT_TRUE(manifest.ok());
  EXPECT_NE(manifest->find("kind: InferenceService"), std::string::npos);
  EXPECT_NE(manifest->find("name: \"my-bert-v2\""), std::string::npos) << *manifest;
  EXPECT_NE(manifest->find("storageUri: \"s3://models/it's \\\"bert\\\"\""), std::string::npos)
      << "YAML's escapes, not C's: " << *manifest;
  EXPECT_NE(manifest->find("runtime: kserve-tritonserver"), std::string::npos);
}

// A result past protobuf's 2 GiB: its weights in model.onnx.data (a sparse 2.1 GiB file here, so the
// test writes nothing), its graph in model.onnx. The repository moves the files and reads the graph;
// nothing serializes or reads the model whole.
TEST_F(ModelRepositoryTest, AResultPastTwoGibibytesIsMovedNotRead) {
  const fs::path folder = dir_ / "download";
  constexpr int64_t kRows = 33000, kCols = 16384;  // 2.01 GiB of float32
  onnx::ModelProto model = Encoder("batch");
  onnx::TensorProto* weight = model.mutable_graph()->add_initializer();
  weight->set_name("embedding");
  weight->set_data_type(onnx::TensorProto::FLOAT);
  weight->add_dims(kRows);
  weight->add_dims(kCols);
  weight->set_data_location(onnx::TensorProto::EXTERNAL);
  for (auto [key, value] : {std::pair<std::string, std::string>{"location", "model.onnx.data"}, {"offset", "0"},
                            {"length", std::to_string(kRows * kCols * 4)}}) {
    auto* entry = weight->add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  }
  ASSERT_TRUE(WriteFileAtomically(folder / "model.onnx", model.SerializeAsString()).ok());
  { std::ofstream(folder / "model.onnx.data", std::ios::binary); }
  fs::resize_file(folder / "model.onnx.data", static_cast<uintmax_t>(kRows * kCols * 4));
  ASSERT_TRUE(WriteFileAtomically(folder / "report.json", "{}").ok());
  ASSERT_GT(fs::file_size(folder / "model.onnx.data"), uintmax_t{2} << 30);

  RepositoryOptions options;
  options.model_name = "big";
  const fs::path repo = dir_ / "models";
  EXPECT_TRUE(CheckModelFitsLayout(folder / "model.onnx", options).ok());
  auto written = WriteModelRepository(LocalResultFiles({folder / "model.onnx", folder / "model.onnx.data", folder / "report.json"}),
                                      CpuReport(), options, repo);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(fs::file_size(repo / "big" / "1" / "model.onnx.data"), static_cast<uintmax_t>(kRows * kCols * 4));
  EXPECT_TRUE(Parse(*ReadFile(repo / "big" / "config.pbtxt")).has_dynamic_batching());
}

TEST(RepositoryOptionsTest, RefusesNamesThatAreNoFolderAndVersionsBelowOne) {
  RepositoryOptions options;
  for (const char* name : {"", "..", "a/b", "with space"}) {
    options.model_name = name;
    EXPECT_EQ(CheckRepositoryOptions(options).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  options.model_name = "ok-name_1.0";
  EXPECT_TRUE(CheckRepositoryOptions(options).ok());
  options.version = 0;
  EXPECT_EQ(CheckRepositoryOptions(options).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseRepositoryLayout("torchserve").ok());
}

}  // namespace
}  // namespace onnxopt::client
