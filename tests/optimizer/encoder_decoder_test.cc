// The decoder of a BART-style encoder-decoder (tests/fixtures/encoder_decoder/bart_decoder.onnx, made by
// tests/fixtures/make_encoder_decoder.py): causal self-attention and cross-attention, whose keys and
// values are projections of the encoder's output, both fuse (the cross-attention as MultiHeadAttention:
// Attention projects one input), with the encoder's padding as the key padding mask, and the result
// matches the original on padded batches where the decoder and the encoder sequences differ in length.
// Each test runs on two spellings of the same decoder: the heads as 4-D tensors, and flattened into the
// batch with bmm products as transformers 4.x's BART, Marian and Whisper wrote it (`--flat-heads`).
#include <filesystem>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/transformer_report.h"
#include "tests/cache_decoder_checks.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

class EncoderDecoderTest : public ::testing::TestWithParam<std::string> {
 protected:
  // The fixture `stem` in the spelling under test.
  std::filesystem::path Fixture(const std::string& stem) const {
    return testing::FixturePath("encoder_decoder/" + stem + GetParam() + ".onnx");
  }
};

TEST_P(EncoderDecoderTest, SelfAndCrossAttentionFuseInEveryLayerAndMatchOnPaddedBatches) {
  auto original = LoadModel(Fixture("bart_decoder"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = testing::OpCounts(run.model);
  constexpr int kLayers = 2;
  EXPECT_EQ(ops["Attention"] + ops["MultiHeadAttention"], 2 * kLayers) << "self- and cross-attention in each layer";
  EXPECT_EQ(ops.count("Softmax"), 0u);
  int cross = 0;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "MultiHeadAttention") continue;
    ASSERT_GE(node.input_size(), 3);
    cross += node.input(1) != node.input(0) ? 1 : 0;
  }
  EXPECT_EQ(cross, kLayers) << "each cross-attention takes its own keys and values";
  EXPECT_EQ(ops["SkipLayerNormalization"], 3 * kLayers) << "after self-attention, cross-attention and the MLP";
  // The report counts two attentions, three norms and one MLP a decoder layer: fully fused.
  const v1::TransformerReport report_section = JudgeTransformerFusion(*original, run.model, run.reports, {});
  EXPECT_TRUE(report_section.fully_fused()) << report_section.DebugString();
  EXPECT_EQ(report_section.expected_ops().at("SkipLayerNormalization"), 3 * kLayers);
  // Decoder sequences of 5 and 12 against the encoder's 16 (a dynamic dim's default), both masks padded.
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 3, {5, 12}, &report);
  EXPECT_EQ(report.padded_masks_size(), 2) << "the decoder's and the encoder's masks";
}

// The same decoder as Optimum exports it for the steps after the first (bart_decoder_with_past.onnx):
// the self-attention's past concatenated before the new keys (the causal mask offset by it) and the
// encoder's keys and values given as inputs. Both attentions fuse, as MultiHeadAttention reading the
// presents and the encoder's keys and values in their [B,N,T,D] layout (merged, they would be copied at
// every step), and the result matches at prefill, at decode after short and long pasts, and for a chunk.
TEST_P(EncoderDecoderTest, WithACacheBothAttentionsFuseOverTheHeadsAsGiven) {
  auto original = LoadModel(Fixture("bart_decoder_with_past"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  constexpr int kLayers = 2;
  std::map<std::string, int> ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["MultiHeadAttention"], 2 * kLayers);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  int layer = 0;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "MultiHeadAttention") continue;
    ASSERT_GE(node.input_size(), 3);
    const std::string prefix = "past_key_values." + std::to_string(layer / 2) + ".encoder.";
    if (layer % 2 == 0) {
      EXPECT_EQ(node.input(1), "present." + std::to_string(layer / 2) + ".decoder.key") << "self-attention on the cache";
    } else {
      EXPECT_EQ(node.input(1), prefix + "key") << "cross-attention on the encoder's keys as given";
      EXPECT_EQ(node.input(2), prefix + "value");
    }
    ++layer;
  }
  testing::ExpectCacheParityOnPaddedBatches(*original, run.model, {{3, 0, 6}, {3, 9, 1}, {2, 130, 1}, {2, 5, 4}}, 2 * kLayers);
}

INSTANTIATE_TEST_SUITE_P(Spellings, EncoderDecoderTest, ::testing::Values("", "_flat_heads"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? std::string("HeadsIn4D") : std::string("FlatHeadsAndBmm");
                         });

// Whisper's decoder as transformers 4.x wrote it (make_encoder_decoder.py --whisper): pre-norm layers,
// k_proj without a bias, flattened heads with bmm, a causal mask with zeros for the past concatenated
// before it, and no padding masks. Self- and cross-attention fuse in every layer, without a cache and
// with one (the encoder's keys and values given), and match the original.
TEST(WhisperDecoderTest, SelfAndCrossAttentionFuseInEveryLayer) {
  auto original = LoadModel(testing::FixturePath("encoder_decoder/whisper_decoder.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = testing::OpCounts(run.model);
  constexpr int kLayers = 2;
  EXPECT_EQ(ops["Attention"] + ops["MultiHeadAttention"], 2 * kLayers) << "self- and cross-attention in each layer";
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_GE(ops["SkipLayerNormalization"], 3 * kLayers);
  // Its positions are the table's rows sliced at the past's offset (no lookup EmbedLayerNormalization
  // takes): detected as Whisper, whose report expects none, and fully fused.
  const v1::TransformerReport section = JudgeTransformerFusion(*original, run.model, run.reports, {});
  EXPECT_EQ(section.family(), "whisper");
  EXPECT_TRUE(section.fully_fused()) << section.DebugString();
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 3, {5, 12}, &report);
}

TEST(WhisperDecoderTest, WithACacheBothAttentionsFuse) {
  auto original = LoadModel(testing::FixturePath("encoder_decoder/whisper_decoder_with_past.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  constexpr int kLayers = 2;
  std::map<std::string, int> ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["MultiHeadAttention"] + ops["GroupQueryAttention"], 2 * kLayers);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  testing::ExpectCacheParityOnPaddedBatches(*original, run.model, {{3, 0, 6}, {3, 9, 1}, {2, 130, 1}, {2, 5, 4}}, 2 * kLayers);
}

}  // namespace
}  // namespace onnxopt
