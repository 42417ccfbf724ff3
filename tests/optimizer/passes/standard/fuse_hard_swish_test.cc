// fuse_hard_swish: every spelling of x * Relu6(x + 3) / 6 and Relu6(x + 3) / 6 becomes HardSigmoid
// (times x) at the opsets exporters write, the outputs match in ONNX Runtime, and look-alikes stay.
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;
using testing::PassRun;
using testing::RunPass;
using testing::SkipCount;

onnx::NodeProto FloatAttributed(onnx::NodeProto node, const std::string& name, float value) {
  auto* attribute = node.add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::FLOAT);
  attribute->set_f(value);
  return node;
}

// Relu6(x + 3) as `opset` writes Clip: bounds as attributes before 11, as inputs from 11 on. x is the
// input stretched 8 times, so that Relu6 clips at both ends in the parity checks.
void AddRelu6OfXPlus3(onnx::GraphProto* graph, int64_t opset, float high = 6.0f) {
  *graph->add_initializer() = FloatTensor("eight", {}, {8.0f});
  *graph->add_node() = MakeNode("Mul", {"input", "eight"}, {"x"});
  *graph->add_initializer() = FloatTensor("three", {}, {3.0f});
  *graph->add_node() = MakeNode("Add", {"x", "three"}, {"shifted"});
  if (opset < 11) {
    *graph->add_node() =
        FloatAttributed(FloatAttributed(MakeNode("Clip", {"shifted"}, {"relu6"}), "min", 0.0f), "max", high);
  } else {
    *graph->add_initializer() = FloatTensor("zero", {}, {0.0f});
    *graph->add_initializer() = FloatTensor("six_bound", {}, {high});
    *graph->add_node() = MakeNode("Clip", {"shifted", "zero", "six_bound"}, {"relu6"});
  }
}

onnx::ModelProto Finish(onnx::GraphProto graph, int64_t opset) {
  *graph.add_input() = FloatValue("input", {2, 4, 5, 5});
  *graph.add_output() = FloatValue("y", {2, 4, 5, 5});
  return MakeModel(std::move(graph), opset);
}

class FuseHardSwishOpsetTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(FuseHardSwishOpsetTest, Paddle2OnnxDivOfProductBecomesHardSigmoidTimesX) {
  onnx::GraphProto graph;
  AddRelu6OfXPlus3(&graph, GetParam());
  *graph.add_node() = MakeNode("Mul", {"x", "relu6"}, {"product"});
  *graph.add_initializer() = FloatTensor("six", {}, {6.0f});
  *graph.add_node() = MakeNode("Div", {"product", "six"}, {"y"});
  const onnx::ModelProto original = Finish(std::move(graph), GetParam());
  PassRun run = RunPass("fuse_hard_swish", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"HardSigmoid", 1}, {"Mul", 2}}));
  ExpectSameOutputs(original, run.model, 1e-6, 1e-5);
}

TEST_P(FuseHardSwishOpsetTest, ScaledGateTimesXAndHardSigmoidAloneFuse) {
  // y = x * (Relu6(x + 3) * (1/6)); z = Relu6(x + 3') / 6 on a second chain.
  onnx::GraphProto graph;
  AddRelu6OfXPlus3(&graph, GetParam());
  *graph.add_initializer() = FloatTensor("sixth", {1}, {1.0f / 6.0f});
  *graph.add_node() = MakeNode("Mul", {"sixth", "relu6"}, {"gate"});
  *graph.add_node() = MakeNode("Mul", {"gate", "x"}, {"y"});
  onnx::ModelProto original = Finish(std::move(graph), GetParam());
  PassRun run = RunPass("fuse_hard_swish", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"HardSigmoid", 1}, {"Mul", 2}}));
  ExpectSameOutputs(original, run.model, 1e-6, 1e-5);

  onnx::GraphProto sigmoid_only;
  AddRelu6OfXPlus3(&sigmoid_only, GetParam());
  *sigmoid_only.add_initializer() = FloatTensor("six", {}, {6.0f});
  *sigmoid_only.add_node() = MakeNode("Div", {"relu6", "six"}, {"y"});
  original = Finish(std::move(sigmoid_only), GetParam());
  run = RunPass("fuse_hard_swish", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"HardSigmoid", 1}, {"Mul", 1}}));
  ExpectSameOutputs(original, run.model, 1e-6, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Opsets, FuseHardSwishOpsetTest, ::testing::Values(9, 11, 14));

TEST(FuseHardSwishTest, OtherBoundsOrAReadIntermediateStay) {
  // Relu6 clipped at 5 is not hard-swish.
  onnx::GraphProto graph;
  AddRelu6OfXPlus3(&graph, 13, 5.0f);
  *graph.add_node() = MakeNode("Mul", {"x", "relu6"}, {"product"});
  *graph.add_initializer() = FloatTensor("six", {}, {6.0f});
  *graph.add_node() = MakeNode("Div", {"product", "six"}, {"y"});
  PassRun run = RunPass("fuse_hard_swish", Finish(std::move(graph), 13));
  EXPECT_EQ(run.report.rewrites(), 0);

  // x + 3 read by a second output: replacing the pattern would lose it.
  onnx::GraphProto read;
  AddRelu6OfXPlus3(&read, 13);
  *read.add_node() = MakeNode("Mul", {"x", "relu6"}, {"product"});
  *read.add_initializer() = FloatTensor("six", {}, {6.0f});
  *read.add_node() = MakeNode("Div", {"product", "six"}, {"y"});
  *read.add_output() = FloatValue("shifted", {2, 4, 5, 5});
  run = RunPass("fuse_hard_swish", Finish(std::move(read), 13));
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(run.report, "read elsewhere"), 1);
}

}  // namespace
}  // namespace onnxopt
