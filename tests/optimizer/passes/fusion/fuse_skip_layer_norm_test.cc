// fuse_skip_layer_norm: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <map>

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
using testing::RunConfig;
using testing::WithIntAttribute;

TEST(FuseSkipLayerNormTest, LeavesADoubledValueAlone) {
  // s = Add(y, y) with y = Add(h, bias): fusing would read y after removing its producer.
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "bias"}, {"y"});
  *graph.add_node() = MakeNode("Add", {"y", "y"}, {"sum"});
  *graph.add_node() = WithIntAttribute(MakeNode("LayerNormalization", {"sum", "gamma", "beta"}, {"out"}), "axis", -1);
  *graph.add_initializer() = FloatTensor("bias", {8}, RandomFloats(8, 61));
  *graph.add_initializer() = FloatTensor("gamma", {8}, RandomFloats(8, 62));
  *graph.add_initializer() = FloatTensor("beta", {8}, RandomFloats(8, 63));
  *graph.add_input() = FloatValue("x", {2, 4, 8});
  *graph.add_output() = FloatValue("out", {2, 4, 8});
  const onnx::ModelProto original = MakeModel(graph, 17);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_skip_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 0);
  ExpectSameOutputs(original, run.model, 0, 0);
}

onnx::ModelProto ResidualLayerNorm(bool sum_is_output) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Add", {"bias", "m"}, {"biased"});
  *graph.add_node() = MakeNode("Add", {"biased", "x"}, {"sum"});
  *graph.add_node() = WithIntAttribute(MakeNode("LayerNormalization", {"sum", "gamma", "beta"}, {"y"}), "axis", -1);
  *graph.add_initializer() = FloatTensor("w", {8, 8}, RandomFloats(64, 51));
  *graph.add_initializer() = FloatTensor("bias", {8}, RandomFloats(8, 52));
  *graph.add_initializer() = FloatTensor("gamma", {8}, RandomFloats(8, 53));
  *graph.add_initializer() = FloatTensor("beta", {8}, RandomFloats(8, 54));
  *graph.add_input() = FloatValue("x", {2, 4, 8});
  *graph.add_output() = FloatValue("y", {2, 4, 8});
  if (sum_is_output) *graph.add_output() = FloatValue("sum", {2, 4, 8});
  return MakeModel(graph, 17);
}

TEST(FuseSkipLayerNormTest, FusesTheResidualAndItsBias) {
  const onnx::ModelProto original = ResidualLayerNorm(false);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_skip_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"MatMul", 1}, {"SkipLayerNormalization", 1}}));
  EXPECT_EQ(run.model.graph().node(1).input_size(), 5) << "the bias became SkipLayerNormalization's fifth input";
  ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
  // A residual sum read elsewhere (here: a graph output) comes out of SkipLayerNormalization's 4th output.
  const onnx::ModelProto with_sum = ResidualLayerNorm(true);
  PassRun kept = RunConfig(R"({"passes": [{"name": "fuse_skip_layer_norm"}]})", with_sum);
  EXPECT_EQ(kept.report.rewrites(), 1);
  ASSERT_EQ(kept.model.graph().node(1).output_size(), 4);
  EXPECT_EQ(kept.model.graph().node(1).output(3), "sum");
  ExpectSameOutputs(with_sum, kept.model, 1e-5, 1e-4);
}

}  // namespace
}  // namespace onnxopt
