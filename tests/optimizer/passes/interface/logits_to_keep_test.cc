// logits_to_keep on decoders of both exporters (the Hugging Face Qwen2 TorchScript export, the
// project's trained Qwen2-shaped decoder): fed nothing, the model computes what the original computes;
// fed k, the original's last k positions. Projections whose logits pass through steps that mix
// positions are left alone with the reason, and the generation benchmark feeds 1 and says so.
#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/cache_interface.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/generation.h"
#include "optimizer/validation/input_generator.h"
#include "tests/parity_matchers.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

onnx::ModelProto Fixture(const std::string& path) {
  auto loaded = LoadModel(testing::FixturePath(absl::StrCat(path, ".onnx")));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *std::move(loaded) : onnx::ModelProto();
}

// The logits of `session` on `inputs`, with logits_to_keep = `keep` fed when keep >= 0.
std::vector<Ort::Value> Logits(Ort::Session& session, const GeneratedInputs& inputs, const std::string& logits,
                               int64_t keep) {
  GeneratedInputs feed = InputViews(inputs);
  if (keep >= 0) {
    Ort::AllocatorWithDefaultOptions allocator;
    const int64_t shape[1] = {1};
    Ort::Value value = Ort::Value::CreateTensor<int64_t>(allocator, shape, 1);
    *value.GetTensorMutableData<int64_t>() = keep;
    feed.names.push_back(kLogitsToKeepInput);
    feed.values.push_back(std::move(value));
  }
  auto ran = RunOnInputs(session, feed, {logits});
  EXPECT_TRUE(ran.ok()) << ran.status();
  return ran.ok() ? *std::move(ran) : std::vector<Ort::Value>();
}

// The largest difference between `kept` [B, K, V] and the last K positions of `all` [B, S, V].
double LastPositionsDiff(const Ort::Value& all, const Ort::Value& kept) {
  const std::vector<int64_t> a = all.GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> k = kept.GetTensorTypeAndShapeInfo().GetShape();
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(k.size(), 3u);
  if (a.size() != 3 || k.size() != 3 || a[0] != k[0] || a[2] != k[2] || k[1] > a[1]) return INFINITY;
  const float* x = all.GetTensorData<float>();
  const float* y = kept.GetTensorData<float>();
  double worst = 0;
  for (int64_t b = 0; b < a[0]; ++b) {
    for (int64_t p = 0; p < k[1]; ++p) {
      for (int64_t v = 0; v < a[2]; ++v) {
        const double d = x[(b * a[1] + a[1] - k[1] + p) * a[2] + v] - y[(b * k[1] + p) * k[2] + v];
        worst = std::max(worst, std::abs(d));
      }
    }
  }
  return worst;
}

class LogitsToKeepTest : public ::testing::TestWithParam<const char*> {};

TEST_P(LogitsToKeepTest, FedNothingEveryPositionFedKTheLastK) {
  const onnx::ModelProto original = Fixture(GetParam());
  testing::PassRun run = testing::RunPass("logits_to_keep", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  const std::optional<CacheInterface> cache = FindCacheInterface(original.graph());
  ASSERT_TRUE(cache.has_value());
  auto a = testing::SessionOf(original);
  auto b = testing::SessionOf(run.model);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->GetInputCount(), b->GetInputCount());  // optional: callers need not feed it
  ASSERT_EQ(b->GetOverridableInitializerCount(), 1u);
  for (const int64_t past : {0, 5}) {
    absl::StatusOr<GeneratedInputs> inputs = StepInputs(*a, original, *cache, 2, past, 6, 0);
    ASSERT_TRUE(inputs.ok()) << inputs.status();
    std::vector<Ort::Value> all = Logits(*a, *inputs, cache->logits_output, -1);
    ASSERT_EQ(all.size(), 1u);
    for (const int64_t keep : {-1, 0, 1, 3, 6}) {
      std::vector<Ort::Value> kept = Logits(*b, *inputs, cache->logits_output, keep);
      ASSERT_EQ(kept.size(), 1u);
      const int64_t positions = keep <= 0 ? 6 : keep;
      EXPECT_EQ(kept[0].GetTensorTypeAndShapeInfo().GetShape()[1], positions) << "keep " << keep;
      EXPECT_LE(LastPositionsDiff(all[0], kept[0]), 1e-4) << "past " << past << ", keep " << keep;
    }
  }
}

TEST_P(LogitsToKeepTest, FusedDecoderKeepsItThroughTheTransformerPresetAndGenerationFeedsOne) {
  const onnx::ModelProto original = Fixture(GetParam());
  testing::PassRun run = testing::RunConfig(
      R"({"preset": "transformer", "passesBefore": [{"name": "logits_to_keep"}]})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_GT(testing::OpCounts(run.model)["GroupQueryAttention"], 0);
  bool declared = false;
  for (const auto& input : run.model.graph().input()) declared |= input.name() == kLogitsToKeepInput;
  EXPECT_TRUE(declared) << "eliminate_initializer_inputs must leave logits_to_keep an input";
  auto a = testing::SessionOf(original);
  auto b = testing::SessionOf(run.model);
  ASSERT_TRUE(a && b);
  const std::optional<CacheInterface> cache = FindCacheInterface(original.graph());
  ASSERT_TRUE(cache.has_value());
  absl::StatusOr<GeneratedInputs> inputs = StepInputs(*a, original, *cache, 2, 0, 5, 0);  // GroupQueryAttention: a past with several new tokens only at batch 1
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  std::vector<Ort::Value> all = Logits(*a, *inputs, cache->logits_output, -1);
  for (const int64_t keep : {-1, 1}) {
    std::vector<Ort::Value> kept = Logits(*b, *inputs, cache->logits_output, keep);
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_LE(LastPositionsDiff(all[0], kept[0]), 1e-3) << "keep " << keep;  // fused attention: float sums reordered
  }
  v1::GenerationConfig settings;
  settings.add_batch_sizes(2);
  settings.set_prefill_tokens(8);
  settings.add_decode_past(4);
  settings.set_greedy_tokens(6);
  settings.set_runs(2);
  absl::StatusOr<v1::GenerationConfig> config = ResolveGenerationConfig(settings);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<v1::GenerationReport> report =
      BenchmarkGeneration(*a, *b, original, *cache, *config, true, 0,
                          TimingOn(v1::DEVICE_CPU), RunContext());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->optimized_keeps_last_logits());
  for (const auto& phase : report->phases()) EXPECT_TRUE(phase.error().empty()) << phase.error();
  EXPECT_TRUE(report->passed()) << report->note();
  EXPECT_EQ(report->identical_steps(), 6);
}

INSTANTIATE_TEST_SUITE_P(Decoders, LogitsToKeepTest,
                         ::testing::Values("hf/qwen2_kv_torchscript", "cache/trained_decoder"),
                         [](const auto& info) { return std::string(info.index == 0 ? "HfQwen2" : "Trained"); });

// hidden [batch, 3, 4] -> MatMul(W [4, 6]) -> `after` -> logits [batch, ?, ?]
onnx::ModelProto ProjectionThen(onnx::NodeProto after, std::vector<onnx::TensorProto> constants, int64_t opset = 14) {
  onnx::GraphProto graph;
  *graph.add_input() = testing::FloatValue("hidden", {-1, 3, 4});
  *graph.add_initializer() = testing::FloatTensor("W", {4, 6}, testing::RandomFloats(24, 1));
  for (auto& constant : constants) *graph.add_initializer() = std::move(constant);
  *graph.add_node() = testing::MakeNode("MatMul", {"hidden", "W"}, {"projected"});
  *graph.add_node() = std::move(after);
  *graph.add_output() = testing::FloatValue("logits", {-1, 3, 6});
  return testing::MakeModel(std::move(graph), opset);
}

TEST(LogitsToKeepLimitsTest, StepsThatMixPositionsAreLeftAloneWithTheReason) {
  onnx::ModelProto transposed =
      ProjectionThen(testing::WithIntsAttribute(testing::MakeNode("Transpose", {"projected"}, {"logits"}), "perm", {0, 2, 1}), {});
  testing::PassRun run = testing::RunPass("logits_to_keep", transposed);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::SkipCount(run.report, "a Transpose after the projection may mix positions"), 1);

  onnx::ModelProto per_position_bias = ProjectionThen(testing::MakeNode("Add", {"projected", "bias"}, {"logits"}),
                                                      {testing::FloatTensor("bias", {3, 6}, testing::RandomFloats(18, 2))});
  run = testing::RunPass("logits_to_keep", per_position_bias);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::SkipCount(run.report, "not take a constant that is the same at every position"), 1);

  // Softmax without an axis: the last one from opset 13, but 1 before, flattening [B, S * V].
  run = testing::RunPass("logits_to_keep", ProjectionThen(testing::MakeNode("Softmax", {"projected"}, {"logits"}), {}, 12));
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::SkipCount(run.report, "a Softmax after the projection may mix positions"), 1);
  run = testing::RunPass("logits_to_keep", ProjectionThen(testing::MakeNode("Softmax", {"projected"}, {"logits"}), {}, 13));
  EXPECT_EQ(run.report.rewrites(), 1);

  onnx::ModelProto scaled = ProjectionThen(testing::MakeNode("Mul", {"projected", "scale"}, {"logits"}),
                                           {testing::FloatTensor("scale", {1, 1, 6}, testing::RandomFloats(6, 3))});
  run = testing::RunPass("logits_to_keep", scaled);
  EXPECT_EQ(run.report.rewrites(), 1);
  auto session = testing::SessionOf(run.model);
  ASSERT_TRUE(session);
  EXPECT_EQ(run.model.graph().output(0).type().tensor_type().shape().dim(1).dim_param(), "logits_positions");
}

}  // namespace
}  // namespace onnxopt
