// TF1 BERT as tf2onnx writes Google's modeling.py (tests/fixtures/tensorflow/tf1_bert.onnx, made by
// tests/fixtures/make_tf1_bert.py): an encoder on 2-D rows [B*S, H], the batch an `unk__` dim read at run
// time, a [B, S, S] mask built once. Computed on [B, S, H] (canonicalize_flattened_rows), every layer's
// attention, both residual LayerNorms and the GELU fuse, and the outputs match on padded masks.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/transformer_report.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

TEST(Tf1BertTest, EveryLayerFusesOnTheRowsComputedInThreeDimensions) {
  auto original = LoadModel(testing::FixturePath("tensorflow/tf1_bert.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["Attention"], 2);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  // Both residual LayerNorms of each layer, and the embeddings' sum with its LayerNorm.
  EXPECT_EQ(ops["SkipLayerNormalization"], 5);
  EXPECT_EQ(ops.count("ReduceMean"), 0u);
  EXPECT_EQ(ops["Gelu"] + ops["BiasGelu"], 2);
  // Its token types are OneHot @ table and its positions a constant: no lookups EmbedLayerNormalization
  // takes, so the report expects none and calls the model fully fused.
  const v1::TransformerReport section = JudgeTransformerFusion(*original, run.model, run.reports, {});
  EXPECT_EQ(section.expected_ops().count("EmbedLayerNormalization"), 0u);
  EXPECT_TRUE(section.fully_fused()) << section.DebugString();
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {}, &report);
}

}  // namespace
}  // namespace onnxopt
