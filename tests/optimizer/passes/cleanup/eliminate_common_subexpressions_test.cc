// eliminate_common_subexpressions: it fires where it may, skips (with its reason) where it may not, and the
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
using testing::RunPass;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

TEST(EliminateCommonSubexpressionsTest, MergesTwinsButNotRandomOps) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"x"}, {"a"}), "perm", {1, 0});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"x"}, {"b"}), "perm", {1, 0});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"x"}, {"c"}), "perm", {0, 1});  // different attribute
  *graph.add_node() = MakeNode("Add", {"a", "b"}, {"s"});
  *graph.add_node() = MakeNode("RandomNormalLike", {"x"}, {"r1"});
  *graph.add_node() = MakeNode("RandomNormalLike", {"x"}, {"r2"});
  *graph.add_node() = MakeNode("Sub", {"r1", "r2"}, {"noise"});
  *graph.add_input() = FloatValue("x", {3, 3});
  *graph.add_output() = FloatValue("s", {3, 3});
  *graph.add_output() = FloatValue("c", {3, 3});
  *graph.add_output() = FloatValue("noise", {3, 3});
  PassRun run = RunPass("eliminate_common_subexpressions", MakeModel(graph, 13));
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model)["Transpose"], 2);
  EXPECT_EQ(OpCounts(run.model)["RandomNormalLike"], 2);
}

// Twins are equal whatever the order of their attributes; the same inputs in another order make
// another node.
TEST(EliminateCommonSubexpressionsTest, ComparesAttributesAsASetAndInputsInOrder) {
  onnx::GraphProto graph;
  onnx::NodeProto first = WithIntAttribute(MakeNode("Gemm", {"x", "w"}, {"a"}), "transB", 1);
  *first.add_attribute() = WithIntAttribute(onnx::NodeProto(), "transA", 0).attribute(0);
  onnx::NodeProto second = WithIntAttribute(MakeNode("Gemm", {"x", "w"}, {"b"}), "transA", 0);
  *second.add_attribute() = WithIntAttribute(onnx::NodeProto(), "transB", 1).attribute(0);
  *graph.add_node() = first;
  *graph.add_node() = second;
  *graph.add_node() = MakeNode("Sub", {"a", "b"}, {"d1"});
  *graph.add_node() = MakeNode("Sub", {"b", "a"}, {"d2"});  // after the merge, the same inputs as d1
  *graph.add_node() = MakeNode("Concat", {"x", "w"}, {"c1"});
  *graph.add_node() = MakeNode("Concat", {"w", "x"}, {"c2"});
  for (int i : {4, 5}) {
    *graph.mutable_node(i)->add_attribute() = WithIntAttribute(onnx::NodeProto(), "axis", 0).attribute(0);
  }
  *graph.add_node() = MakeNode("Add", {"d1", "d2"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {3, 3}, RandomFloats(9, 2));
  *graph.add_input() = FloatValue("x", {3, 3});
  *graph.add_output() = FloatValue("y", {3, 3});
  *graph.add_output() = FloatValue("c1", {6, 3});
  *graph.add_output() = FloatValue("c2", {6, 3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("eliminate_common_subexpressions", original);
  EXPECT_EQ(run.report.rewrites(), 2);  // the Gemms, then the Subs
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Gemm", 1}, {"Sub", 1}, {"Concat", 2}, {"Add", 1}}));
  ExpectSameOutputs(original, run.model);
}

}  // namespace
}  // namespace onnxopt
