// A decoder with a key/value cache in older transformers' spelling (tests/fixtures/cache/
// legacy_cache_decoder.onnx, made by tests/fixtures/make_legacy_cache_decoder.py): the causal mask built
// for the past's offset with triu(P+1) and the padding as (1 - mask) * finfo.min, summed to -inf where
// both mask and the scores clamped at finfo.min, the past concatenated before grouped K/V are repeated.
// That float mask, probed, is causal with the key padding of attention_mask: the attention fuses as
// GroupQueryAttention on the cache's key/value heads (the repeat and the Concats gone, the presents
// written by the operator), and matches the original on padded batches at prefill, decode and a chunk
// after a past (at batch 1: ONNX Runtime's kernel refuses a chunk after a past at a larger batch), and
// along a greedy generation.
#include <map>
#include <string>

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

TEST_F(LegacyCacheDecoderTest, AttentionFusesAsGroupQueryAttentionOnTheCache) {
  std::map<std::string, int> ops = testing::OpCounts(run_.model);
  EXPECT_EQ(ops["GroupQueryAttention"], kLegacyLayers);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  // repeat_kv (Unsqueeze -> Expand -> Reshape of the cache's heads) is gone: no Expand feeds a Reshape.
  std::map<std::string, std::string> producer_op;
  for (const auto& node : run_.model.graph().node()) {
    for (const auto& output : node.output()) producer_op[output] = node.op_type();
  }
  for (const auto& node : run_.model.graph().node()) {
    if (node.op_type() == "Reshape") EXPECT_NE(producer_op[node.input(0)], "Expand") << node.name();
  }
  for (const auto& node : run_.model.graph().node()) {
    if (node.op_type() != "GroupQueryAttention") continue;
    ASSERT_GE(node.input_size(), 5);
    EXPECT_EQ(node.input(3).rfind("past_key_values.", 0), 0u) << "the past goes in as the operator's own";
  }
  const std::optional<CacheInterface> kept = FindCacheInterface(run_.model.graph());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->entries.size(), static_cast<size_t>(2 * kLegacyLayers));
}

// Prefill, decode after a short and a long past, and a chunk after a past; rows padded on the left and
// on the right by up to 40%. Left padding longer than the past masks rows entirely: the original's clamp
// makes them uniform over every key, the causal kernel over the keys up to the query; no unmasked
// position reads them, and parity skips them (the pass counts them).
TEST_F(LegacyCacheDecoderTest, OutputsAndPresentsMatchOnPaddedBatchesAtPrefillAndDecode) {
  testing::ExpectCacheParityOnPaddedBatches(original_, run_.model, {{3, 0, 16}, {3, 16, 1}, {3, 130, 1}, {1, 9, 7}},
                                            2 * kLegacyLayers, /*skip_rows_masked_entirely=*/true);
}

TEST_F(LegacyCacheDecoderTest, GreedyGenerationPicksTheSameTokens) {
  testing::ExpectIdenticalGreedyGeneration(original_, run_.model, 24);
}

}  // namespace
}  // namespace onnxopt
