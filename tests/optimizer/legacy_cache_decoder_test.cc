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
#include "tests/cache_decoder_checks.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

constexpr int kLegacyLayers = 2;

class LegacyCacheDecoderTest : public ::testing::Test, protected testing::TransformerPresetTest {
 protected:
  void SetUp() override { LoadAndOptimize("cache/legacy_cache_decoder.onnx"); }
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
  testing::ExpectCacheParityOnPaddedBatches(original_, run_.model, {{3, 0, 16}, {3, 16, 1}, {3, 130, 1}, {2, 9, 7}},
                                            2 * kLegacyLayers);
}

TEST_F(LegacyCacheDecoderTest, GreedyGenerationPicksTheSameTokens) {
  testing::ExpectIdenticalGreedyGeneration(original_, run_.model, 24);
}

}  // namespace
}  // namespace onnxopt
