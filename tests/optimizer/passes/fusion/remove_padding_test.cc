// remove_padding on fused encoders: the token-wise blocks run on the valid tokens, the outputs match
// the padded model on every valid position (judged by a job on the mask's valid positions), and
// models it does not fit are left alone with the reason.
#include <filesystem>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

// The Hugging Face BERT export through the transformer preset: EmbedLayerNormalization, then two
// layers of Attention (raw [B, S] mask), SkipLayerNormalization and MatMul -> BiasGelu -> MatMul.
onnx::ModelProto FusedBert() {
  auto exported = LoadModel(testing::FixturePath("hf/bert_torchscript.onnx"));
  EXPECT_TRUE(exported.ok());
  testing::PassRun fused = testing::RunConfig(R"({"preset": "transformer"})", *exported);
  EXPECT_TRUE(fused.status.ok()) << fused.status;
  return fused.model;
}

TEST(RemovePaddingTest, PacksEveryLayerAndMatchesOnValidPositions) {
  const onnx::ModelProto fused = FusedBert();
  testing::PassRun packed = testing::RunPass("remove_padding", fused);
  EXPECT_EQ(packed.report.rewrites(), 2) << "both layers";
  auto ops = testing::OpCounts(packed.model);
  EXPECT_EQ(ops["NonZero"], 1);
  EXPECT_EQ(ops["ScatterND"], 3) << "before each Attention and after the last layer";
  EXPECT_EQ(ops["Gather"], 3) << "the embedding and each Attention output";

  // Through a job: batch 8, half the positions padding at most, judged where the mask is 1.
  const auto dir = testing::TempDir("remove_padding_job");
  ASSERT_TRUE(SaveModel(fused, dir / "fused.onnx").ok());
  OptimizeRequest request;
  request.model_path = dir / "fused.onnx";
  request.output_dir = dir / "out";
  request.config.add_passes()->set_name("remove_padding");
  (*request.config.mutable_validation()->mutable_dim_values())["batch"] = 8;
  (*request.config.mutable_validation()->mutable_dim_values())["sequence"] = 64;
  request.config.mutable_validation()->set_mask_padding(0.5);
  request.config.mutable_benchmark()->set_skip(true);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::ParityReport& parity = result->report.parity();
  EXPECT_TRUE(parity.passed());
  EXPECT_EQ(parity.valid_positions_of(), "attention_mask");
  ASSERT_GT(parity.outputs_size(), 0);
  EXPECT_LT(parity.outputs(0).max_abs_error(), 1e-4);
}

TEST(RemovePaddingTest, AnUnfusedEncoderIsLeftAlone) {
  auto exported = LoadModel(testing::FixturePath("hf/bert_torchscript.onnx"));
  ASSERT_TRUE(exported.ok());
  testing::PassRun run = testing::RunPass("remove_padding", *exported);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::OpCounts(run.model)["NonZero"], 0);
}

}  // namespace
}  // namespace onnxopt
