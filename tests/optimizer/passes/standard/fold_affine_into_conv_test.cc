// fold_affine_into_conv: a per-channel or scalar scale and shift before a Conv that pads nothing goes
// into its weights and bias (grouped, strided, with or without a bias), the outputs match in ONNX
// Runtime, and a padded Conv or a map read elsewhere keeps it.
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
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

TEST(FoldAffineIntoConvTest, PerChannelScaleAndShiftFoldIntoAGroupedPointwiseConv) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Mul", {"scale", "x"}, {"scaled"});  // the constant first
  *graph.add_node() = MakeNode("Add", {"scaled", "shift"}, {"shifted"});
  *graph.add_node() = WithIntAttribute(MakeNode("Conv", {"shifted", "w", "b"}, {"y"}), "group", 2);
  *graph.add_initializer() = FloatTensor("scale", {4, 1, 1}, RandomFloats(4, 1));
  *graph.add_initializer() = FloatTensor("shift", {1, 4, 1, 1}, RandomFloats(4, 2));
  *graph.add_initializer() = FloatTensor("w", {6, 2, 1, 1}, RandomFloats(12, 3));
  *graph.add_initializer() = FloatTensor("b", {6}, RandomFloats(6, 4));
  *graph.add_input() = FloatValue("x", {2, 4, 6, 6});
  *graph.add_output() = FloatValue("y", {2, 6, 6, 6});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("fold_affine_into_conv", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

TEST(FoldAffineIntoConvTest, AScalarShiftFoldsIntoAStridedConvWithoutBias) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "shift"}, {"shifted"});
  *graph.add_node() = WithIntsAttribute(
      WithIntsAttribute(MakeNode("Conv", {"shifted", "w"}, {"y"}), "strides", {2, 2}), "pads", {0, 0, 0, 0});
  *graph.add_initializer() = FloatTensor("shift", {1}, {0.75f});
  *graph.add_initializer() = FloatTensor("w", {3, 4, 3, 3}, RandomFloats(108, 5));
  *graph.add_input() = FloatValue("x", {1, 4, 9, 9});
  *graph.add_output() = FloatValue("y", {1, 3, 4, 4});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("fold_affine_into_conv", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

TEST(FoldAffineIntoConvTest, APaddedConvAMapReadElsewhereOrABroadcastKeepsIt) {
  // a = x * s + t before a Conv padding 1 (its border would read zeros, not t); c = x * s + t before
  // a pointwise Conv, but c is also an output; e = one-channel g times 4 channels' scales (the Mul
  // broadcasts g to the 4 channels the Conv reads).
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Mul", {"x", "scale"}, {"scaled"});
  *graph.add_node() = MakeNode("Add", {"scaled", "shift"}, {"a"});
  *graph.add_node() = WithIntsAttribute(MakeNode("Conv", {"a", "w"}, {"y"}), "pads", {1, 1, 1, 1});
  *graph.add_node() = MakeNode("Mul", {"x", "scale"}, {"scaled2"});
  *graph.add_node() = MakeNode("Add", {"scaled2", "shift"}, {"c"});
  *graph.add_node() = MakeNode("Conv", {"c", "w1"}, {"z"});
  *graph.add_node() = MakeNode("Mul", {"g", "scales"}, {"e"});
  *graph.add_node() = MakeNode("Conv", {"e", "w1"}, {"v"});
  *graph.add_initializer() = FloatTensor("scales", {1, 4, 1, 1}, RandomFloats(4, 8));
  *graph.add_input() = FloatValue("g", {1, 1, 5, 5});
  *graph.add_output() = FloatValue("v", {1, 2, 5, 5});
  *graph.add_initializer() = FloatTensor("scale", {}, {1.5f});
  *graph.add_initializer() = FloatTensor("shift", {}, {0.5f});
  *graph.add_initializer() = FloatTensor("w", {2, 4, 3, 3}, RandomFloats(72, 6));
  *graph.add_initializer() = FloatTensor("w1", {2, 4, 1, 1}, RandomFloats(8, 7));
  *graph.add_input() = FloatValue("x", {1, 4, 5, 5});
  *graph.add_output() = FloatValue("y", {1, 2, 5, 5});
  *graph.add_output() = FloatValue("z", {1, 2, 5, 5});
  *graph.add_output() = FloatValue("c", {1, 4, 5, 5});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("fold_affine_into_conv", original);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(run.report, "pads its input"), 1);
  EXPECT_EQ(SkipCount(run.report, "channels are not known to be the Conv's"), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Add", 2}, {"Conv", 3}, {"Mul", 3}}));
}

}  // namespace
}  // namespace onnxopt
