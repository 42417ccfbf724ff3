// Blocks as TensorFlow's exporters write them (tests/fixtures/tensorflow/, made by
// tests/fixtures/make_tensorflow_style_blocks.py): the batch_normalization spelling of LayerNorm and a
// keras2onnx BERT self-attention, whose Dense layers flatten their 3-D input around each MatMul, and TF2 Keras'
// Einsum attention. They fuse (the int64 mask cast to the int32 Attention reads)
// under the transformer preset and match the original in ONNX Runtime (the attention on padded masks).
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

TEST(TensorflowBlocksTest, TheBatchNormalizationSpellingOfLayerNormFuses) {
  auto original = LoadModel(testing::FixturePath("tensorflow/tf_layer_norm.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(testing::OpCounts(run.model), (std::map<std::string, int>{{"LayerNormalization", 1}}));
  testing::ExpectSameOutputs(*original, run.model, 1e-5, 1e-4);
}

TEST(TensorflowBlocksTest, AKerasSelfAttentionFuses) {
  auto original = LoadModel(testing::FixturePath("tensorflow/keras_attention.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["Attention"], 1);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_EQ(ops.count("Reshape"), 0u) << "the Dense layers' flattening Reshapes are gone";
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {}, &report);
}

// TF2 Keras' EinsumDense projections and layers.MultiHeadAttention products (lower_einsum), in a post-norm
// layer: one Attention, both residual LayerNorms SkipLayerNormalization, parity on padded masks.
TEST(TensorflowBlocksTest, AKerasEinsumAttentionFuses) {
  auto original = LoadModel(testing::FixturePath("tensorflow/keras_einsum_attention.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(testing::OpCounts(run.model),
            (std::map<std::string, int>{{"Attention", 1}, {"SkipLayerNormalization", 2}, {"MatMul", 1}, {"Cast", 1}}));
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {}, &report);
}

}  // namespace
}  // namespace onnxopt
