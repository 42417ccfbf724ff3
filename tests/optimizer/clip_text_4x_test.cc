// transformers 4.x's CLIP text encoder (tests/fixtures/transformers/clip_text_4x.onnx, made by
// tests/fixtures/make_clip_text_4x.py): heads flattened into the batch and two masks added in turn on the
// scores viewed as [B, N, S, S]. Detected as CLIP, it fuses every layer (canonicalize_flat_heads, then
// canonicalize_summed_masks) and matches the original on padded masks.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/transformer_report.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

TEST(ClipText4xTest, TheFamilyIsFoundThroughTheViewsAroundEachMask) {
  auto original = LoadModel(testing::FixturePath("transformers/clip_text_4x.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  const TransformerShape shape = DetectTransformer(*original);
  EXPECT_EQ(shape.family, "clip");
  EXPECT_EQ(shape.layers, 2);
}

TEST(ClipText4xTest, EveryLayerFusesWithBothMasks) {
  auto original = LoadModel(testing::FixturePath("transformers/clip_text_4x.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["Attention"] + ops["MultiHeadAttention"], 2);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_EQ(ops["SkipLayerNormalization"], 4);
  EXPECT_EQ(ops["QuickGelu"], 2);
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {8}, &report);
}

}  // namespace
}  // namespace onnxopt
