// A GPT-2 block as Megatron-LM writes it (tests/fixtures/megatron/megatron_gpt2.onnx, made by
// tests/fixtures/make_megatron_gpt2.py): Q/K/V packed per head, the mask applied multiplicatively, its
// tanh GELU spelling, positions read at a position_ids input. Every fusion of a GPT-2 fires and the result
// matches the original on padded batches.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/transformer_report.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

TEST(MegatronGpt2Test, EveryFusionFiresAndOutputsMatchOnPaddedBatches) {
  auto original = LoadModel(testing::FixturePath("megatron/megatron_gpt2.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["Attention"], 2);
  EXPECT_EQ(ops["EmbedLayerNormalization"], 1);
  EXPECT_EQ(ops["FastGelu"], 2);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  const v1::TransformerReport report = JudgeTransformerFusion(*original, run.model, run.reports, {});
  EXPECT_TRUE(report.fully_fused()) << report.DebugString();
  v1::ParityReport parity;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 3, {8, 21}, &parity);
}

}  // namespace
}  // namespace onnxopt
