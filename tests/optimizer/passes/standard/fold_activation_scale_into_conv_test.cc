// fold_activation_scale_into_conv: a scalar scale after a Conv's hard-swish (either sign) or ReLU
// (positive, or a division) goes into the Conv, the outputs match in ONNX Runtime where the gate clips
// at both ends, and a negative scale after a ReLU stays.
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
using testing::RandomFloats;
using testing::RunPass;
using testing::SkipCount;

// x (stretched 8 times, so that the gates clip at both ends) through Conv(w, b) into `conv`.
void AddConv(onnx::GraphProto* graph, const std::string& conv, uint32_t seed, bool bias = true) {
  if (graph->node_size() == 0) {
    *graph->add_initializer() = FloatTensor("eight", {}, {8.0f});
    *graph->add_node() = MakeNode("Mul", {"input", "eight"}, {"x"});
  }
  *graph->add_initializer() = FloatTensor(conv + "_w", {4, 3, 3, 3}, RandomFloats(108, seed));
  std::vector<std::string> inputs = {"x", conv + "_w"};
  if (bias) {
    *graph->add_initializer() = FloatTensor(conv + "_b", {4}, RandomFloats(4, seed + 1));
    inputs.push_back(conv + "_b");
  }
  *graph->add_node() = MakeNode("Conv", inputs, {conv});
}

onnx::ModelProto Finish(onnx::GraphProto graph, const std::vector<std::string>& outputs) {
  *graph.add_input() = FloatValue("input", {2, 3, 7, 7});
  for (const auto& output : outputs) *graph.add_output() = FloatValue(output, {2, 4, 5, 5});
  return MakeModel(std::move(graph), 13);
}

onnx::NodeProto HardSigmoid(const std::string& input, const std::string& output) {
  onnx::NodeProto node = MakeNode("HardSigmoid", {input}, {output});
  auto* alpha = node.add_attribute();
  alpha->set_name("alpha");
  alpha->set_type(onnx::AttributeProto::FLOAT);
  alpha->set_f(1.0f / 6.0f);
  return node;
}

TEST(FoldActivationScaleIntoConvTest, AHardSwishsScaleOfEitherSignFoldsIntoTheConv) {
  onnx::GraphProto graph;
  AddConv(&graph, "c", 1);
  *graph.add_node() = HardSigmoid("c", "gate");
  *graph.add_node() = MakeNode("Mul", {"gate", "c"}, {"swish"});
  *graph.add_initializer() = FloatTensor("negative", {1}, {-0.7f});
  *graph.add_node() = MakeNode("Mul", {"negative", "swish"}, {"y"});
  AddConv(&graph, "d", 3, /*bias=*/false);
  *graph.add_node() = HardSigmoid("d", "gate_d");
  *graph.add_node() = MakeNode("Mul", {"d", "gate_d"}, {"swish_d"});
  *graph.add_initializer() = FloatTensor("positive", {}, {1.3f});
  *graph.add_node() = MakeNode("Mul", {"swish_d", "positive"}, {"z"});
  const onnx::ModelProto original = Finish(std::move(graph), {"y", "z"});
  PassRun run = RunPass("fold_activation_scale_into_conv", original);
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 2}, {"HardSigmoid", 2}, {"Mul", 3}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

TEST(FoldActivationScaleIntoConvTest, AReluDividedByAConstantFoldsAndANegativeScaleStays) {
  onnx::GraphProto graph;
  AddConv(&graph, "c", 5);
  *graph.add_node() = MakeNode("Relu", {"c"}, {"relu"});
  *graph.add_initializer() = FloatTensor("two", {}, {2.0f});
  *graph.add_node() = MakeNode("Div", {"relu", "two"}, {"y"});
  AddConv(&graph, "d", 7);
  *graph.add_node() = MakeNode("Relu", {"d"}, {"relu_d"});
  *graph.add_initializer() = FloatTensor("negative", {}, {-2.0f});
  *graph.add_node() = MakeNode("Mul", {"relu_d", "negative"}, {"z"});
  const onnx::ModelProto original = Finish(std::move(graph), {"y", "z"});
  PassRun run = RunPass("fold_activation_scale_into_conv", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(SkipCount(run.report, "negative scale"), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 2}, {"Mul", 2}, {"Relu", 2}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace
}  // namespace onnxopt
