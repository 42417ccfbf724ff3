// GPT-2 with its cache stacked per layer, past_{i} [2,B,N,P,D] -> present_{i} [2,B,N,P+S,D], as transformers
// 3.x (keys split as [B,N,D,S] and stacked back transposed) and ONNX Runtime's own GPT-2 export write it
// (tests/fixtures/stacked_past/, made by tests/fixtures/make_stacked_past_gpt2.py). Every layer becomes
// ONNX Runtime's Attention with that past and present, unidirectional for the causal buffer cut at the
// past's offset, and matches the original on padded batches at prefill, decode and a chunk after a past,
// and along a greedy generation.
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

constexpr int kStackedLayers = 2;

class StackedPastGpt2Test : public ::testing::TestWithParam<std::string>, protected testing::TransformerPresetTest {
 protected:
  void SetUp() override { LoadAndOptimize("stacked_past/" + GetParam() + ".onnx"); }
};

TEST_P(StackedPastGpt2Test, EveryLayerBecomesAttentionWithThePastAndPresent) {
  std::map<std::string, int> ops = testing::OpCounts(run_.model);
  EXPECT_EQ(ops["Attention"], kStackedLayers);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_EQ(ops.count("Split"), 0u) << "the past is read by the fused operators";
  int layer = 0;
  for (const auto& node : run_.model.graph().node()) {
    if (node.op_type() != "Attention") continue;
    ASSERT_GE(node.input_size(), 5);
    ASSERT_EQ(node.output_size(), 2);
    EXPECT_EQ(node.input(4).rfind("past_", 0), 0u) << "input 4 is the layer's stacked past";
    EXPECT_EQ(node.output(1).rfind("present_", 0), 0u) << "output 1 writes the layer's present";
    EXPECT_FALSE(node.input(3).empty()) << "the padding goes in as mask_index";
    bool unidirectional = false;
    for (const auto& attribute : node.attribute()) unidirectional |= attribute.name() == "unidirectional" && attribute.i() == 1;
    EXPECT_TRUE(unidirectional);
    ++layer;
  }
  EXPECT_EQ(layer, kStackedLayers);
  const std::optional<CacheInterface> kept = FindCacheInterface(run_.model.graph());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->entries.size(), static_cast<size_t>(kStackedLayers));
}

// Prefill, decode after a short and a long past, and a chunk after a past, rows padded on the left and on
// the right by up to 40%. A query that sees only padding (at prefill, left padding) is not compared, as
// the pass says: its row is a softmax over masked keys only, which the original's Where and Attention's
// additive mask make differently, and no unmasked position reads it.
TEST_P(StackedPastGpt2Test, OutputsAndPresentsMatchOnPaddedBatchesAtPrefillAndDecode) {
  bool said = false;
  for (const auto& pass : run_.reports) said |= pass.counters().count("rows_masked_entirely_differ") > 0;
  EXPECT_TRUE(said) << "fuse_attention counts the rows it does not reproduce";
  testing::ExpectCacheParityOnPaddedBatches(original_, run_.model, {{3, 0, 16}, {3, 16, 1}, {3, 100, 1}, {2, 9, 7}},
                                            kStackedLayers, /*skip_rows_masked_entirely=*/true);
}

// Without the skip, only the prefill's rows that see nothing but padding differ: the skip hides nothing else.
TEST_P(StackedPastGpt2Test, OnlyRowsThatSeeNothingButPaddingDiffer) {
  testing::ExpectCacheParityOnPaddedBatches(original_, run_.model, {{3, 16, 1}, {3, 100, 1}, {2, 9, 7}},
                                            kStackedLayers);
}

TEST_P(StackedPastGpt2Test, GreedyGenerationPicksTheSameTokens) {
  testing::ExpectIdenticalGreedyGeneration(original_, run_.model, 24);
}

// The causal buffer's rows must start at T - S: cut from T - T instead (which the original runs only
// without a past), the Where is not read as the causal mask and nothing fuses.
TEST_P(StackedPastGpt2Test, ABufferCutAtAnotherOffsetIsNotTheCausalMask) {
  onnx::ModelProto tampered = original_;
  int subs = 0;
  for (auto& node : *tampered.mutable_graph()->mutable_node()) {
    // The exporter names the row start's Sub(T, S) ".../attn/Sub" (the mask's own Subs come after it).
    const std::string& name = node.name();
    if (node.op_type() != "Sub" || name.size() < 9 || name.compare(name.size() - 9, 9, "/attn/Sub") != 0) continue;
    node.set_input(1, node.input(0));  // the query length's place: the key length again
    ++subs;
  }
  ASSERT_EQ(subs, kStackedLayers) << "one T - S per layer";
  testing::PassRun refused = testing::RunConfig(R"({"preset": "transformer"})", tampered);
  ASSERT_TRUE(refused.status.ok()) << refused.status;
  EXPECT_EQ(testing::OpCounts(refused.model).count("Attention"), 0u);
}

INSTANTIATE_TEST_SUITE_P(KeySpellings, StackedPastGpt2Test,
                         ::testing::Values("gpt2_transposed_keys", "gpt2_plain_keys", "gpt2_multiplied_mask"));

}  // namespace
}  // namespace onnxopt
