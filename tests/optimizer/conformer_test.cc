// Speech Conformer encoders with relative-position attention, as ESPnet, WeNet and NeMo write it
// (tests/fixtures/conformer/*.onnx, made by tests/fixtures/make_conformer.py): the scale after the sum
// of Q*K^T and the position term, masked_fill before the Softmax and after it, ESPnet's and NeMo's
// rel_shift, a [B, 1, T] mask input. Detected as a Conformer, every layer fuses as MultiHeadAttention
// with the position term as its attention_bias, and matches the original on padded masks (NeMo's
// masks whole rows of padded frames, which both give as 0).
#include <string>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/transformer_report.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

class ConformerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformerTest, IsDetectedAsAConformer) {
  auto original = LoadModel(testing::FixturePath("conformer/" + GetParam() + ".onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  const TransformerShape shape = DetectTransformer(*original);
  EXPECT_EQ(shape.family, "conformer");
  EXPECT_EQ(shape.layers, 2);
}

TEST_P(ConformerTest, EveryLayerFusesWithThePositionTermAsItsBias) {
  auto original = LoadModel(testing::FixturePath("conformer/" + GetParam() + ".onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["MultiHeadAttention"], 2);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "MultiHeadAttention") continue;
    ASSERT_GE(node.input_size(), 6);
    EXPECT_FALSE(node.input(5).empty()) << "the position term goes in as attention_bias";
  }
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 3, {7, 16}, &report);
}

INSTANTIATE_TEST_SUITE_P(Toolkits, ConformerTest, ::testing::Values("espnet", "wenet", "nemo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace onnxopt
