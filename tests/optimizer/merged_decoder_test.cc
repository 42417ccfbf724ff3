// Optimum's merged decoder: the decoder without a past and the one with it as the branches of an If on
// `use_cache_branch`, their weights in the outer graph. Fixture (2 layers, 4 heads over 2 key/value
// heads, SDPA's boolean mask with the NaN guard, transformers 4.3x's rotary with its squeeze If):
//   python3 tests/fixtures/spelling_grid.py
//       merged.stored_squeeze_gather.sdpa_neginf_nanguard.expand_reshape.rms.swiglu.bias
//       tests/fixtures/cache/merged_decoder.onnx   (one command)
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "optimizer/cache_interface.h"
#include "optimizer/transformer_report.h"
#include "optimizer/validation/input_generator.h"
#include "tests/cache_decoder_checks.h"
#include "tests/parity_matchers.h"

namespace onnxopt {
namespace {

constexpr int kLayers = 2;

class MergedDecoderTest : public ::testing::Test, protected testing::TransformerPresetTest {
 protected:
  void SetUp() override { LoadAndOptimize("cache/merged_decoder.onnx"); }
};

// Operators of each If branch of `model`'s main graph, by op type.
std::map<std::string, std::map<std::string, int>> BranchOps(const onnx::ModelProto& model) {
  std::map<std::string, std::map<std::string, int>> ops;
  for (const auto& node : model.graph().node()) {
    if (node.op_type() != "If") continue;
    for (const auto& attribute : node.attribute()) {
      if (!attribute.has_g()) continue;
      for (const auto& inner : attribute.g().node()) ++ops[attribute.name()][inner.op_type()];
    }
  }
  return ops;
}

int64_t InitializerBytes(const onnx::GraphProto& graph) {
  int64_t bytes = 0;
  for (const auto& tensor : graph.initializer()) bytes += static_cast<int64_t>(tensor.ByteSizeLong());
  for (const auto& node : graph.node()) {
    for (const auto& attribute : node.attribute()) {
      if (attribute.has_g()) bytes += InitializerBytes(attribute.g());
    }
  }
  return bytes;
}

TEST_F(MergedDecoderTest, TheCacheInterfaceNamesTheBranchInput) {
  const std::optional<CacheInterface> cache = FindCacheInterface(original_.graph());
  ASSERT_TRUE(cache.has_value());
  EXPECT_EQ(cache->use_cache_input, "use_cache_branch");
  EXPECT_EQ(cache->entries.size(), 2u * kLayers);
  EXPECT_EQ(cache->mask_input, "attention_mask");
}

// A prefill takes the branch without a past, a step after one the branch with it: parity covers both.
TEST_F(MergedDecoderTest, GeneratedInputsTakeTheBranchThePastCallsFor) {
  auto session = testing::SessionOf(original_, ORT_DISABLE_ALL);
  ASSERT_TRUE(session);
  for (const int64_t past : {0, 5}) {
    const DimValues dims = {{"batch", 2}, {"sequence", 3}, {"past_sequence", past}};
    absl::StatusOr<GeneratedInputs> inputs = GenerateInputs(*session, original_, v1::ValidationConfig(), dims, 0);
    ASSERT_TRUE(inputs.ok()) << inputs.status();
    bool found = false;
    for (size_t i = 0; i < inputs->names.size(); ++i) {
      if (inputs->names[i] != "use_cache_branch") continue;
      found = true;
      EXPECT_EQ(*inputs->values[i].GetTensorData<bool>(), past > 0) << "past " << past;
    }
    EXPECT_TRUE(found);
  }
}

TEST_F(MergedDecoderTest, EveryLayerOfBothBranchesFusesAndTheWeightsStayShared) {
  const auto ops = BranchOps(run_.model);
  ASSERT_EQ(ops.size(), 2u);
  for (const auto& [branch, counts] : ops) {
    const auto count = [&](const char* op) { return counts.count(op) > 0 ? counts.at(op) : 0; };
    EXPECT_EQ(count("GroupQueryAttention") + count("MultiHeadAttention"), kLayers) << branch;
    EXPECT_EQ(count("Softmax"), 0) << branch;
  }
  const v1::TransformerReport report = JudgeTransformerFusion(original_, run_.model, run_.reports, ModelHints());
  EXPECT_EQ(report.layers(), 2 * kLayers) << "both decoders' layers are counted";
  EXPECT_EQ(report.fused_kinds().at("Attention"), 2 * kLayers);
  // The branches read the outer weights, as before: the optimized model holds them once.
  EXPECT_LT(InitializerBytes(run_.model.graph()), InitializerBytes(original_.graph()) * 11 / 10);
}

TEST_F(MergedDecoderTest, MatchesOnPaddedBatchesAtPrefillDecodeAndAChunkAfterAPast) {
  testing::ExpectCacheParityOnPaddedBatches(original_, run_.model, {{2, 0, 7}, {2, 6, 1}, {1, 6, 4}}, 2 * kLayers,
                                            /*skip_rows_masked_entirely=*/true);
}

TEST_F(MergedDecoderTest, GreedyGenerationPicksTheSameTokens) {
  const v1::GenerationReport report = testing::ExpectIdenticalGreedyGeneration(original_, run_.model, 8);
  EXPECT_EQ(report.steps_size(), 8);
}

}  // namespace
}  // namespace onnxopt
