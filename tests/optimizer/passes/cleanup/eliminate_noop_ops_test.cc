// eliminate_noop_ops: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::MakeValue;
using testing::PassRun;
using testing::RunPass;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

TEST(EliminateNoopOpsTest, RemovesEveryKindOfNoop) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"x"}, {"a"}), "to", onnx::TensorProto::FLOAT);
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"a"}, {"b"}), "perm", {0, 1});
  *graph.add_node() = MakeNode("Concat", {"b"}, {"c"});
  (*graph.mutable_node(2)->add_attribute()) = WithIntAttribute(onnx::NodeProto(), "axis", 0).attribute(0);
  *graph.add_node() = MakeNode("Reshape", {"c", "shape"}, {"d"});
  *graph.add_node() = MakeNode("Slice", {"d", "zeros", "big"}, {"e"});
  *graph.add_node() = MakeNode("Pad", {"e", "no_pads"}, {"f"});
  *graph.add_node() = MakeNode("Relu", {"f"}, {"y"});
  *graph.add_initializer() = MakeInt64Tensor("shape", {2, 3});
  *graph.add_initializer() = MakeInt64Tensor("zeros", {0, 0});
  *graph.add_initializer() = MakeInt64Tensor("big", {INT64_MAX, INT64_MAX});
  *graph.add_initializer() = MakeInt64Tensor("no_pads", {0, 0, 0, 0});
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_output() = FloatValue("y", {2, 3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("eliminate_noop_ops", original);
  EXPECT_EQ(run.report.rewrites(), 6);
  EXPECT_EQ(run.model.graph().node_size(), 1);
  ExpectSameOutputs(original, run.model);
}

TEST(EliminateNoopOpsTest, KeepsCastsThatConvertAndReshapesThatReshape) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"x"}, {"a"}), "to", onnx::TensorProto::DOUBLE);
  *graph.add_node() = MakeNode("Reshape", {"a", "shape"}, {"y"});
  *graph.add_initializer() = MakeInt64Tensor("shape", {3, 2});
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_output() = MakeValue("y", onnx::TensorProto::DOUBLE, {3, 2});
  PassRun run = RunPass("eliminate_noop_ops", MakeModel(graph, 13));
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(run.model.graph().node_size(), 2);
}

}  // namespace
}  // namespace onnxopt
