#include "optimizer/validation/parity.h"
#include "optimizer/validation/benchmark.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "optimizer/validation/input_generator.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/transformer_report.h"
#include "tests/parity_matchers.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FixturePath;

TEST(AllCloseTest, FollowsTheAllcloseRule) {
  EXPECT_TRUE(AllClose(1.0, 1.0, 0, 0));
  EXPECT_FALSE(AllClose(1.0 + 1e-9, 1.0, 0, 0));
  EXPECT_TRUE(AllClose(1.001, 1.0, 0, 1e-3 + 1e-12));
  EXPECT_TRUE(AllClose(1e-5, 0.0, 1e-4, 0));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(AllClose(nan, nan, 0, 0));
  EXPECT_FALSE(AllClose(nan, 1.0, 1, 1));
  EXPECT_TRUE(AllClose(inf, inf, 0, 0));
  EXPECT_FALSE(AllClose(-inf, inf, 1, 1));
}

TEST(CompareOutputTest, MeasuresErrorsAndFlagsIntroducedNaN) {
  std::vector<float> expected = {1, 2, 3, 4};
  std::vector<float> close = {1, 2, 3, 4.0001f};
  std::vector<float> broken = {1, std::nanf(""), 3, 5};
  v1::OutputParity ok;
  CompareOutput(testing::FloatTensorValue(expected), testing::FloatTensorValue(close), 1e-3, 0, &ok);
  EXPECT_TRUE(ok.passed());
  EXPECT_NEAR(ok.max_abs_error(), 1e-4, 1e-5);
  v1::OutputParity bad;
  CompareOutput(testing::FloatTensorValue(expected), testing::FloatTensorValue(broken), 1e-3, 0, &bad);
  EXPECT_FALSE(bad.passed());
  EXPECT_TRUE(bad.nan_or_inf_introduced());
  EXPECT_DOUBLE_EQ(bad.mismatch_fraction(), 0.5);
  EXPECT_DOUBLE_EQ(bad.max_abs_error(), 1.0);
  std::vector<float> shorter = {1, 2, 3};
  v1::OutputParity shape;
  CompareOutput(testing::FloatTensorValue(expected), testing::FloatTensorValue(shorter), 1, 1, &shape);
  EXPECT_FALSE(shape.passed());
  EXPECT_NE(shape.note().find("shape"), std::string::npos);
}

// Logits [rows, classes]: the first row hesitates (two tokens nearly tied), the others are decided.
TEST(CompareOutputTest, LogitsThatFlipOnlyWhereTheOriginalHesitatesPassByKlDivergence) {
  static Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  constexpr int64_t kRows = 16, kClasses = 8;
  std::vector<float> original(kRows * kClasses), quantized;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kClasses; ++c) original[r * kClasses + c] = c == r % kClasses ? 6.0f : 0.1f * c;
  }
  original[1] = 6.0f - 0.01f;  // row 0: classes 0 and 1 nearly tied
  quantized = original;
  for (size_t i = 0; i < quantized.size(); ++i) quantized[i] += 0.05f * static_cast<float>((i * 7) % 5) - 0.1f;
  quantized[0] = 5.9f, quantized[1] = 6.0f;  // row 0 flips, by 0.1
  const int64_t shape[] = {1, kRows, kClasses};
  auto value = [&](std::vector<float>& data) {
    return Ort::Value::CreateTensor<float>(memory, data.data(), data.size(), shape, 3);
  };
  v1::OutputParity by_kl;
  by_kl.set_name("logits");
  CompareOutput(value(original), value(quantized), 1e-3, 1e-3, &by_kl, /*min_cosine=*/0.98, 0, /*max_kl=*/0.01);
  EXPECT_NEAR(by_kl.top1_agreement(), 15.0 / 16, 1e-12);
  EXPECT_GT(by_kl.kl_divergence(), 0.0);
  EXPECT_LT(by_kl.kl_divergence(), 0.01);
  EXPECT_TRUE(by_kl.passed()) << by_kl.note();
  EXPECT_NE(by_kl.note().find("KL divergence"), std::string::npos) << by_kl.note();

  v1::OutputParity top1_only;
  top1_only.set_name("logits");
  CompareOutput(value(original), value(quantized), 1e-3, 1e-3, &top1_only, 0.98, 0, /*max_kl=*/0);
  EXPECT_FALSE(top1_only.passed()) << "without the KL rule one flip in 16 rows fails the 99% top-1 agreement";

  v1::OutputParity hidden;
  hidden.set_name("last_hidden_state");
  CompareOutput(value(original), value(quantized), 1e-3, 1e-3, &hidden, 0.98, 0, 0.01);
  EXPECT_DOUBLE_EQ(hidden.kl_divergence(), -1.0) << "only logits are read as distributions";

  // A decided row flipping costs far more than the threshold.
  std::vector<float> wrong = original;
  std::swap(wrong[2 * kClasses + 2], wrong[2 * kClasses + 3]);
  v1::OutputParity decided;
  decided.set_name("logits");
  CompareOutput(value(original), value(wrong), 1e-3, 1e-3, &decided, 0.9, 0, 0.01);
  EXPECT_GT(decided.kl_divergence(), 0.01);
  EXPECT_FALSE(decided.passed());
}

TEST(SummarizeTest, Percentiles) {
  std::vector<double> latencies;
  for (int i = 100; i >= 1; --i) latencies.push_back(i);
  v1::LatencyStats stats = Summarize(latencies);
  EXPECT_EQ(stats.runs(), 100);
  EXPECT_NEAR(stats.p50_ms(), 50.5, 1e-9);
  EXPECT_NEAR(stats.p90_ms(), 90.1, 1e-9);
  EXPECT_DOUBLE_EQ(stats.min_ms(), 1);
  EXPECT_DOUBLE_EQ(stats.max_ms(), 100);
  EXPECT_NEAR(stats.mean_ms(), 50.5, 1e-9);
}

TEST(InputGeneratorTest, MaskPaddingZeroMeansAllOnes) {
  auto model = LoadModel(FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(model.ok());
  auto session = CreateSession({model->SerializeAsString(), {}}, {});
  ASSERT_TRUE(session.ok()) << session.status();
  v1::ValidationConfig config;
  config.set_mask_padding(0);
  auto inputs = GenerateInputs(**session, *model, config, 0);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  EXPECT_TRUE(inputs->padded_masks.empty());
  for (size_t i = 0; i < inputs->names.size(); ++i) {
    if (inputs->names[i] != "attention_mask") continue;
    const int64_t* data = inputs->values[i].GetTensorData<int64_t>();
    const size_t count = inputs->values[i].GetTensorTypeAndShapeInfo().GetElementCount();
    EXPECT_EQ(std::count(data, data + count, int64_t{1}), static_cast<std::ptrdiff_t>(count));
  }
}

TEST(InputGeneratorTest, IdsStayInsideTheEmbeddingTableAndDimsFollowTheConfig) {
  auto model = LoadModel(FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(model.ok());
  auto session = CreateSession({model->SerializeAsString(), {}}, {});
  ASSERT_TRUE(session.ok()) << session.status();
  v1::ValidationConfig config;
  (*config.mutable_dim_values())["sequence"] = 24;
  config.set_seed(7);
  auto inputs = GenerateInputs(**session, *model, config, 0);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->names.size(), 3u);
  for (size_t i = 0; i < inputs->names.size(); ++i) {
    EXPECT_EQ(inputs->shapes[inputs->names[i]], "1x24");
    const int64_t* data = inputs->values[i].GetTensorData<int64_t>();
    int64_t low = INT64_MAX, high = INT64_MIN;
    for (int k = 0; k < 24; ++k) {
      low = std::min(low, data[k]);
      high = std::max(high, data[k]);
    }
    if (inputs->names[i] == "input_ids") {
      EXPECT_GE(low, 0);
      EXPECT_LT(high, 128);
      EXPECT_GT(high, low) << "ids should vary";
    } else if (inputs->names[i] == "attention_mask") {
      // Padded by default: the last quarter of the one row is 0, the rest 1.
      EXPECT_EQ(std::count(data, data + 24, int64_t{0}), 6);
      EXPECT_EQ(data[0], 1);
      EXPECT_EQ(data[23], 0);
      EXPECT_EQ(inputs->padded_masks, std::vector<std::string>{"attention_mask"});
    } else {
      EXPECT_GE(low, 0);
      EXPECT_LT(high, 2);  // token types index a table of 2 rows
    }
  }
}

TEST(OptimizeTest, LocalRunProducesAModelAndACompleteReport) {
  const auto out = std::filesystem::temp_directory_path() / ("onnxopt_optimize_" + std::to_string(::getpid()));
  OptimizeRequest request;
  request.model_path = FixturePath("bert_tiny.onnx");
  request.output_dir = out;
  request.config.mutable_benchmark()->set_iterations(5);
  request.config.mutable_benchmark()->set_warmup_runs(1);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::Report& report = result->report;
  EXPECT_EQ(report.original().nodes(), 261);
  EXPECT_LT(report.optimized().nodes(), 253) << "more than the 8 Identity nodes go";
  EXPECT_EQ(report.optimized().op_histogram().count("Constant"), 0u) << "constants are folded";
  EXPECT_TRUE(report.parity().passed());
  EXPECT_EQ(report.parity().outputs_size(), 2);
  EXPECT_EQ(report.benchmark().original().runs(), 5);
  EXPECT_GT(report.benchmark().speedup(), 0);
  EXPECT_EQ(report.benchmark().execution_provider(), "CPUExecutionProvider");
  EXPECT_TRUE(std::filesystem::exists(out / "model.onnx"));
  std::filesystem::remove_all(out);
}

// A model with external data is optimized with its big tensors by reference: they never enter
// memory, the result's data file gets them file to file, and the result is the same model, with the
// same parity and benchmark, as the one optimized from the model with its data inline.
TEST(OptimizeTest, ExternalDataStaysByReferenceAndGivesTheSameResult) {
  const auto dir = testing::TempDir("optimize_by_reference");
  auto inline_model = LoadModel(FixturePath("hf/gpt2_torchscript.onnx"));
  ASSERT_TRUE(inline_model.ok());
  SaveOptions external;
  external.external_threshold_bytes = 0;
  std::filesystem::create_directories(dir / "in");
  ASSERT_TRUE(SaveModel(*inline_model, dir / "in" / "model.onnx", external).ok());
  auto referenced = LoadModelByReference(dir / "in" / "model.onnx");
  ASSERT_TRUE(referenced.ok());
  ASSERT_TRUE(HasTensorsByReference(*referenced)) << "the fixture has tensors of 64 KiB and more";

  auto run = [&](const std::filesystem::path& model, const std::string& out) {
    OptimizeRequest request;
    request.model_path = model;
    request.output_dir = dir / out;
    request.config.set_preset(v1::Pipelines::transformer);
    request.config.mutable_benchmark()->set_iterations(3);
    request.config.mutable_benchmark()->set_warmup_runs(1);
    return Optimize(request);
  };
  auto from_file = run(dir / "in" / "model.onnx", "by_reference");
  auto from_memory = run(FixturePath("hf/gpt2_torchscript.onnx"), "inline");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  ASSERT_TRUE(from_memory.ok()) << from_memory.status();
  EXPECT_TRUE(from_file->report.parity().passed());
  EXPECT_GT(from_file->report.benchmark().speedup(), 0);
  ASSERT_EQ(from_file->files.size(), 2u);
  EXPECT_EQ(from_file->files[1].filename(), "model.onnx.data");
  EXPECT_EQ(from_file->report.original().model_bytes(), from_memory->report.original().model_bytes() -
                                                            static_cast<int64_t>(inline_model->ByteSizeLong()) +
                                                            ModelBytes(*referenced));
  EXPECT_EQ(from_file->report.original().initializer_bytes(), from_memory->report.original().initializer_bytes());
  EXPECT_EQ(from_file->report.optimized().initializer_bytes(), from_memory->report.optimized().initializer_bytes());
  auto a = LoadModel(from_file->files[0]);
  auto b = LoadModel(from_memory->files[0]);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  ASSERT_EQ(a->graph().initializer_size(), b->graph().initializer_size());
  for (int i = 0; i < a->graph().initializer_size(); ++i) {
    EXPECT_EQ(a->graph().initializer(i).name(), b->graph().initializer(i).name());
    EXPECT_EQ(a->graph().initializer(i).raw_data(), b->graph().initializer(i).raw_data()) << a->graph().initializer(i).name();
  }
  EXPECT_EQ(a->graph().node_size(), b->graph().node_size());
  for (int i = 0; i < a->graph().node_size(); ++i) {
    EXPECT_EQ(a->graph().node(i).SerializeAsString(), b->graph().node(i).SerializeAsString()) << i;
  }
}

// The build links the CUDA-capable ONNX Runtime core: CUDA is in the build; whether it runs here is
// probed, and where it does not the reason names the library that is missing.
TEST(ProviderStatusTest, TheBuildHasCudaAndSaysWhyItCannotRunHere) {
  const auto& statuses = ProviderStatuses();
  auto find = [&](const std::string& name) {
    return std::find_if(statuses.begin(), statuses.end(), [&](const ProviderStatus& p) { return p.name == name; });
  };
  ASSERT_NE(find("CPUExecutionProvider"), statuses.end());
  EXPECT_TRUE(find("CPUExecutionProvider")->usable);
  const auto available = OrtAvailableProviders();
  EXPECT_NE(std::find(available.begin(), available.end(), "CUDAExecutionProvider"), available.end())
      << "the linked core is the CUDA build (onnxruntime-node's)";
  auto cuda = find("CUDAExecutionProvider");
  ASSERT_NE(cuda, statuses.end());
  if (!cuda->usable) {
    EXPECT_NE(cuda->reason.find(".so"), std::string::npos) << cuda->reason;
  }
  EXPECT_EQ(ProviderFor(v1::DEVICE_CUDA).ok(), cuda->usable);
}

TEST(OptimizeTest, CudaIsAnErrorWhereThereIsNoneNeverASilentFallback) {
  if (ProviderFor(v1::DEVICE_CUDA).ok()) GTEST_SKIP() << "this machine has CUDA";
  OptimizeRequest request;
  request.model_path = FixturePath("cnn_tiny.onnx");
  request.output_dir = std::filesystem::temp_directory_path() / ("onnxopt_cuda_" + std::to_string(::getpid()));
  request.config.mutable_benchmark()->set_device(v1::DEVICE_CUDA);
  auto result = Optimize(request);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(result.status().message().find("CUDA_UNAVAILABLE"), std::string::npos);
  EXPECT_NE(result.status().message().find(".so"), std::string::npos) << "names what could not be loaded: "
                                                                       << result.status().message();
  std::filesystem::remove_all(request.output_dir);
}

TEST(OptimizeTest, ARandomOriginalIsReportedAsSuchNotBlamedOnTheOptimizer) {
  // y = x + RandomNormalLike(x): every run differs, whatever the optimizer does.
  onnx::GraphProto graph;
  *graph.add_node() = testing::MakeNode("RandomNormalLike", {"x"}, {"noise"});
  *graph.add_node() = testing::MakeNode("Add", {"x", "noise"}, {"y"});
  *graph.add_input() = testing::FloatValue("x", {64});
  *graph.add_output() = testing::FloatValue("y", {64});
  const auto dir = std::filesystem::temp_directory_path() / ("onnxopt_random_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteFileAtomically(dir / "random.onnx", testing::MakeModel(graph).SerializeAsString()).ok());
  OptimizeRequest request;
  request.model_path = dir / "random.onnx";
  request.output_dir = dir / "out";
  request.config.mutable_benchmark()->set_skip(true);
  auto result = Optimize(request);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(result.status().message().find("NONDETERMINISTIC_MODEL"), std::string::npos) << result.status();
  request.config.mutable_validation()->set_skip(true);
  auto unchecked = Optimize(request);
  ASSERT_TRUE(unchecked.ok()) << unchecked.status();
  EXPECT_TRUE(unchecked->report.parity().skipped());
  std::filesystem::remove_all(dir);
}

// With validation and the benchmark skipped the pipeline takes the original model instead of a copy;
// the report's transformer section, read from the original, must come out as it does with a copy.
TEST(OptimizeTest, WithoutValidationOrBenchmarkTheReportStillJudgesTheFusions) {
  const auto dir = std::filesystem::temp_directory_path() / ("onnxopt_moved_" + std::to_string(::getpid()));
  OptimizeRequest request;
  request.model_path = FixturePath("gpt2_tiny.onnx");
  request.output_dir = dir;
  request.config.set_preset(v1::Pipelines::transformer);
  request.config.mutable_benchmark()->set_skip(true);
  request.config.mutable_validation()->set_skip(true);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  absl::StatusOr<onnx::ModelProto> original = LoadModel(request.model_path);
  absl::StatusOr<onnx::ModelProto> optimized = LoadModel(dir / "model.onnx");
  ASSERT_TRUE(original.ok() && optimized.ok());
  const v1::TransformerReport expected = JudgeTransformerFusion(*original, *optimized, {}, ModelHints());
  const v1::TransformerReport& got = result->report.transformer();
  EXPECT_EQ(got.family(), "gpt2");
  EXPECT_EQ(got.family(), expected.family());
  EXPECT_EQ(got.layers(), expected.layers());
  EXPECT_EQ(got.fused_kinds().at("Attention"), expected.fused_kinds().at("Attention"));
  EXPECT_GT(got.fused_kinds().at("Attention"), 0);
  EXPECT_EQ(result->report.original().nodes(), CountNodes(original->graph()));
  std::filesystem::remove_all(dir);
}

TEST(OptimizeTest, NewerOpsetsLoadWithAWarningInsteadOfTheChecker) {
  onnx::GraphProto graph;
  *graph.add_node() = testing::MakeNode("Relu", {"x"}, {"y"});
  *graph.add_input() = testing::FloatValue("x", {2});
  *graph.add_output() = testing::FloatValue("y", {2});
  std::vector<std::string> warnings;
  EXPECT_TRUE(CheckModel(testing::MakeModel(graph, 21), &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("opset 21"), std::string::npos);
  onnx::GraphProto broken = graph;
  broken.mutable_node(0)->set_input(0, "missing");
  EXPECT_EQ(CheckModel(testing::MakeModel(broken, 14), &warnings).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace onnxopt
