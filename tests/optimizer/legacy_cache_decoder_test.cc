// A decoder with a key/value cache in older transformers' spelling (tests/fixtures/cache/
// legacy_cache_decoder.onnx, made by tests/fixtures/make_legacy_cache_decoder.py): the causal mask built
// for the past's offset with triu(P+1) and the padding as (1 - mask) * finfo.min, summed to -inf where
// both mask and the scores clamped at finfo.min, the past concatenated before grouped K/V are repeated.
// GroupQueryAttention cannot take that float bias; the attention still fuses, as MultiHeadAttention over
// the heads the graph computes (its Concats stay the presents), and matches the original on padded
// batches at prefill and decode and along a greedy generation.
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/cache_interface.h"
#include "optimizer/model_io.h"
#include "optimizer/validation/generation.h"
#include "optimizer/validation/parity.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

constexpr int kLegacyLayers = 2;

class LegacyCacheDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = LoadModel(testing::FixturePath("cache/legacy_cache_decoder.onnx"));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    original_ = *std::move(loaded);
    run_ = testing::RunConfig(R"({"preset": "transformer"})", original_);
    ASSERT_TRUE(run_.status.ok()) << run_.status;
  }
  onnx::ModelProto original_;
  testing::PassRun run_;
};

TEST_F(LegacyCacheDecoderTest, AttentionFusesOverTheHeadsTheGraphComputes) {
  std::map<std::string, int> ops = testing::OpCounts(run_.model);
  EXPECT_EQ(ops["MultiHeadAttention"], kLegacyLayers);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_EQ(ops["Concat"] >= 2 * kLegacyLayers, true) << "the cache's Concats stay: they are the presents";
  bool noted = false;
  for (const auto& pass : run_.reports) {
    for (const auto& note : pass.notes()) noted |= absl::StrContains(note, "over the heads as the graph computes them");
  }
  EXPECT_TRUE(noted) << "the report says the core fused over the heads as given";
  for (const auto& node : run_.model.graph().node()) {
    if (node.op_type() != "MultiHeadAttention") continue;
    ASSERT_EQ(node.input_size(), 6);
    EXPECT_FALSE(node.input(5).empty()) << "the mask goes in as attention_bias";
  }
  const std::optional<CacheInterface> kept = FindCacheInterface(run_.model.graph());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->entries.size(), static_cast<size_t>(2 * kLegacyLayers));
}

// Prefill, decode after a short and a long past, and a chunk after a past; rows padded on the left and
// on the right by up to 40% (left padding longer than the past masks rows entirely, which the original's
// clamp turns into uniform rows, as the fused operator's finite bias does).
TEST_F(LegacyCacheDecoderTest, OutputsAndPresentsMatchOnPaddedBatchesAtPrefillAndDecode) {
  auto a = testing::SessionOf(original_, ORT_DISABLE_ALL);
  auto b = testing::SessionOf(run_.model, ORT_DISABLE_ALL);
  ASSERT_TRUE(a && b);
  v1::ValidationConfig config;
  config.set_atol(1e-4);
  config.set_rtol(0);
  config.set_samples(2);
  config.set_mask_padding(0.4);
  struct Shape {
    int64_t batch, past, sequence;
  };
  for (const Shape& shape : {Shape{3, 0, 16}, Shape{3, 16, 1}, Shape{3, 130, 1}, Shape{2, 9, 7}}) {
    auto* dims = config.add_shapes()->mutable_dim_values();
    (*dims)["batch"] = shape.batch;
    (*dims)["past_sequence"] = shape.past;
    (*dims)["sequence"] = shape.sequence;
  }
  v1::ParityReport report;
  absl::Status status = CheckParity({*a, original_, *b}, config, {}, RunContext(), &report);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(report.passed()) << report.DebugString();
  EXPECT_EQ(report.outputs_size(), 2 * 4 * (1 + 2 * kLegacyLayers)) << "logits and every present, each shape";
}

TEST_F(LegacyCacheDecoderTest, GreedyGenerationPicksTheSameTokens) {
  auto a = testing::SessionOf(original_, ORT_DISABLE_ALL);
  auto b = testing::SessionOf(run_.model, ORT_DISABLE_ALL);
  ASSERT_TRUE(a && b);
  const std::optional<CacheInterface> cache = FindCacheInterface(original_.graph());
  ASSERT_TRUE(cache.has_value());
  v1::GenerationConfig settings;
  settings.set_greedy_tokens(24);
  settings.set_prompt_tokens(12);
  absl::StatusOr<v1::GenerationConfig> config = ResolveGenerationConfig(settings);
  ASSERT_TRUE(config.ok()) << config.status();
  v1::GenerationReport report;
  absl::Status status = CompareGreedyGeneration(*a, *b, original_, *cache, *config, /*exact_tokens=*/true, &report);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(report.passed()) << report.DebugString();
  EXPECT_EQ(report.identical_steps(), 24);
  EXPECT_LT(report.max_kl_divergence(), 1e-6);
}

}  // namespace
}  // namespace onnxopt
