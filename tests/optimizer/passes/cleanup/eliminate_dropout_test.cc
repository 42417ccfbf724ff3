// eliminate_dropout: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::BoolScalar;
using testing::ExpectSameOutputs;
using testing::FixturePath;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;
using testing::PassRun;
using testing::RunPass;
using testing::SkipCount;

onnx::ModelProto DropoutModel(int64_t opset, bool training_flag, bool use_mask) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  std::vector<std::string> inputs = {"a"};
  if (opset >= 12) {
    *graph.add_initializer() = FloatTensor("ratio", {}, {0.5f});
    *graph.add_initializer() = BoolScalar("training", training_flag);
    inputs = {"a", "ratio", "training"};
  }
  *graph.add_node() = MakeNode("Dropout", inputs, {"b", "mask"});
  *graph.add_node() = MakeNode("Neg", {"b"}, {"y"});
  *graph.add_input() = FloatValue("x", {4});
  *graph.add_output() = FloatValue("y", {4});
  if (use_mask) *graph.add_output() = testing::MakeValue("mask", onnx::TensorProto::BOOL, {4});
  return MakeModel(graph, opset);
}

TEST(EliminateDropoutTest, RemovesInferenceDropout) {
  for (int64_t opset : {11, 13}) {
    const onnx::ModelProto original = DropoutModel(opset, false, false);
    PassRun run = RunPass("eliminate_dropout", original);
    EXPECT_EQ(run.report.rewrites(), 1) << "opset " << opset;
    EXPECT_EQ(OpCounts(run.model)["Dropout"], 0);
    ExpectSameOutputs(original, run.model);
  }
}

TEST(EliminateDropoutTest, KeepsTrainingDropoutAndUsedMasks) {
  PassRun training = RunPass("eliminate_dropout", DropoutModel(13, true, false));
  EXPECT_EQ(training.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(training.report, "training_mode"), 1);

  PassRun mask = RunPass("eliminate_dropout", DropoutModel(13, false, true));
  EXPECT_EQ(mask.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(mask.report, "mask"), 1);
}

TEST(EliminateDropoutTest, LeavesExportedTrainingModeDropoutAlone) {
  auto original = LoadModel(FixturePath("bert_tiny_train.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunPass("eliminate_dropout", *original);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(run.report, "training_mode"), 7);
}

}  // namespace
}  // namespace onnxopt
