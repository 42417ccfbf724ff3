// fold_constants: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
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
using testing::RunPass;
using testing::WithIntsAttribute;

TEST(FoldConstantsTest, FoldsConstantChainsAndStaticShapes) {
  onnx::GraphProto graph;
  onnx::NodeProto constant = MakeNode("Constant", {}, {"k"});
  auto* value = constant.add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  *value->mutable_t() = FloatTensor("", {3}, {1, 2, 3});
  *graph.add_node() = constant;
  *graph.add_node() = MakeNode("Add", {"k", "w"}, {"kw"});               // constant
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"m"}, {"mt"}), "perm", {1, 0});  // constant
  *graph.add_node() = MakeNode("Shape", {"x"}, {"s"});                    // static shape
  *graph.add_node() = MakeNode("Reshape", {"x", "s"}, {"xr"});
  *graph.add_node() = MakeNode("MatMul", {"xr", "mt"}, {"p"});
  *graph.add_node() = MakeNode("Add", {"p", "kw"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {3}, {10, 20, 30});
  *graph.add_initializer() = FloatTensor("m", {3, 3}, RandomFloats(9, 1));
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_output() = FloatValue("y", {2, 3});
  const onnx::ModelProto original = MakeModel(graph, 14);
  PassRun run = RunPass("fold_constants", original);
  EXPECT_EQ(run.report.rewrites(), 4);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Add", 1}, {"MatMul", 1}, {"Reshape", 1}}));
  ExpectSameOutputs(original, run.model);
}

// Constants become initializers before anything folds (exports have tens of thousands), with what
// folding them as nodes gave: equal small ones become one, one whose readers all fold leaves
// nothing behind, and one that is a graph output or bigger than max_output_bytes (left to the general
// path) still folds with its reader or keeps its name.
TEST(FoldConstantsTest, ConstantsBecomeInitializersOnceAndOnlyWhereRead) {
  auto constant = [](const std::string& output, std::vector<float> values) {
    onnx::NodeProto node = MakeNode("Constant", {}, {output});
    auto* value = node.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    *value->mutable_t() = FloatTensor("", {static_cast<int64_t>(values.size())}, values);
    return node;
  };
  onnx::GraphProto graph;
  *graph.add_node() = constant("c1", {1, 2, 3});
  *graph.add_node() = constant("c2", {1, 2, 3});  // equal to c1
  *graph.add_node() = constant("c3", {4, 5, 6});  // read only by a node that folds
  *graph.add_node() = constant("big", std::vector<float>(64, 7));
  *graph.add_node() = constant("out", {8, 9, 10});
  *graph.add_node() = MakeNode("Mul", {"x", "c1"}, {"y1"});
  *graph.add_node() = MakeNode("Mul", {"x", "c2"}, {"y2"});
  *graph.add_node() = MakeNode("Neg", {"c3"}, {"n"});
  *graph.add_node() = MakeNode("Mul", {"x", "n"}, {"y3"});
  *graph.add_node() = MakeNode("ReduceSum", {"big"}, {"total"});
  *graph.add_node() = MakeNode("Add", {"x", "total"}, {"y4"});
  *graph.add_input() = FloatValue("x", {3});
  for (const char* output : {"y1", "y2", "y3", "y4"}) *graph.add_output() = FloatValue(output, {3});
  *graph.add_output() = FloatValue("out", {3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fold_constants", "params": {"max_output_bytes": 128}}]})",
                          original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::set<std::string> initializers;
  for (const auto& tensor : run.model.graph().initializer()) initializers.insert(tensor.name());
  EXPECT_EQ(initializers, (std::set<std::string>{"c1", "n", "out", "total"}));
  std::set<std::string> constants;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Constant") constants.insert(node.output(0));
    if (node.output(0) == "y2") {
      EXPECT_EQ(node.input(1), "c1");
    }
  }
  EXPECT_TRUE(constants.empty());
  EXPECT_EQ(run.report.rewrites(), 7);  // five Constants, Neg, ReduceSum
  ExpectSameOutputs(original, run.model);
}

// fold_constants keeps the types of what it leaves, but a shape it computes in ONNX Runtime (Abs:
// no rule knows its values) is news to the shapes: the next pass must see the Reshape is a no-op.
TEST(FoldConstantsTest, AValueTheShapesDidNotKnowMakesThemInferAgain) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Abs", {"c"}, {"target"});
  *graph.add_node() = MakeNode("Reshape", {"x", "target"}, {"r"});
  *graph.add_node() = MakeNode("Relu", {"r"}, {"y"});
  *graph.add_initializer() = MakeInt64Tensor("c", {-2, 3});
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_output() = FloatValue("y", {2, 3});
  const onnx::ModelProto original = MakeModel(graph, 14);
  PassRun run = RunConfig(R"({"passes": [{"name": "eliminate_noop_ops"}, {"name": "fold_constants"},
                                         {"name": "eliminate_noop_ops"}]})",
                          original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Relu", 1}}));
  ExpectSameOutputs(original, run.model);
}

// Nodes that compute the same thing from equal constants run once in ONNX Runtime; a node reading a
// twin's result reads the first one's there. Equal results become one initializer, the first's.
TEST(FoldConstantsTest, TwinsRunOnceAndTakeCopies) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Pow", {"four", "half"}, {"p1"});
  *graph.add_node() = MakeNode("Pow", {"also_four", "half"}, {"p2"});  // p1's twin
  *graph.add_node() = MakeNode("Add", {"p2", "one"}, {"q2"});          // reads the twin's result
  *graph.add_node() = MakeNode("Mul", {"x", "p1"}, {"y"});
  *graph.add_node() = MakeNode("Mul", {"x", "p2"}, {"w"});
  *graph.add_node() = MakeNode("Mul", {"x", "q2"}, {"z"});
  *graph.add_initializer() = FloatTensor("four", {1}, {4});
  *graph.add_initializer() = FloatTensor("also_four", {1}, {4});
  *graph.add_initializer() = FloatTensor("half", {1}, {0.5});
  *graph.add_initializer() = FloatTensor("one", {1}, {1});
  *graph.add_input() = FloatValue("x", {2});
  for (const char* output : {"y", "w", "z"}) *graph.add_output() = FloatValue(output, {2});
  const onnx::ModelProto original = MakeModel(graph, 15);
  PassRun run = RunPass("fold_constants", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 3);
  EXPECT_EQ(run.report.counters().at("nodes_run_in_onnx_runtime"), 2);  // p1 and q2
  EXPECT_EQ(run.report.counters().at("twins_given_copies"), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Mul", 3}}));
  std::set<std::string> initializers;
  for (const auto& tensor : run.model.graph().initializer()) initializers.insert(tensor.name());
  EXPECT_TRUE(initializers.count("p1") > 0 && initializers.count("q2") > 0);
  EXPECT_EQ(initializers.count("p2"), 0u) << "p2 equals p1: its reader reads p1";
  for (const auto& node : run.model.graph().node()) {
    if (node.output(0) == "w") {
      EXPECT_EQ(node.input(1), "p1");
    }
  }
  ExpectSameOutputs(original, run.model);
}

// A folded value that is a graph output keeps its name even when an equal one was folded before it.
TEST(FoldConstantsTest, AFoldedGraphOutputKeepsItsNameBesideAnEqualValue) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Neg", {"two"}, {"a"});
  *graph.add_node() = MakeNode("Neg", {"also_two"}, {"b"});  // equal to a, and an output
  *graph.add_node() = MakeNode("Mul", {"x", "a"}, {"y"});
  *graph.add_initializer() = FloatTensor("two", {1}, {2});
  *graph.add_initializer() = FloatTensor("also_two", {1}, {2});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_output() = FloatValue("y", {2});
  *graph.add_output() = FloatValue("b", {1});
  const onnx::ModelProto original = MakeModel(graph, 15);
  PassRun run = RunPass("fold_constants", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::set<std::string> initializers;
  for (const auto& tensor : run.model.graph().initializer()) initializers.insert(tensor.name());
  EXPECT_TRUE(initializers.count("a") > 0 && initializers.count("b") > 0);
  ExpectSameOutputs(original, run.model);
}

TEST(FoldConstantsTest, NeverBlowsTheModelUpNorTouchesOverridableInputs) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("ConstantOfShape", {"big_shape"}, {"big"});  // 4 MB of zeros from 16 bytes
  *graph.add_node() = MakeNode("ReduceSum", {"big"}, {"total"});
  *graph.add_node() = MakeNode("Add", {"x", "total"}, {"sum"});
  *graph.add_node() = MakeNode("Mul", {"sum", "overridable"}, {"y"});
  *graph.add_node() = MakeNode("Neg", {"overridable"}, {"z"});
  *graph.add_initializer() = MakeInt64Tensor("big_shape", {1024, 1024});
  *graph.add_initializer() = FloatTensor("overridable", {1}, {2});
  *graph.add_input() = FloatValue("x", {1});
  *graph.add_input() = FloatValue("overridable", {1});
  *graph.add_output() = FloatValue("y", {1});
  *graph.add_output() = FloatValue("z", {1});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("fold_constants", original);
  // ConstantOfShape -> ReduceSum folds as a whole (its result is one float); the 4 MB value is never
  // stored, and nothing reading `overridable` folds.
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_LT(run.model.ByteSizeLong(), 1000u);
  EXPECT_EQ(OpCounts(run.model).count("Neg"), 1u);
  ExpectSameOutputs(original, run.model);

  // With ReduceSum fed by a graph input too, the big value would have to be stored: it is not.
  onnx::GraphProto mixed = graph;
  mixed.mutable_node(1)->set_op_type("Add");
  mixed.mutable_node(1)->add_input("x");
  PassRun kept = RunPass("fold_constants", MakeModel(mixed, 13));
  EXPECT_EQ(kept.report.rewrites(), 0);
  EXPECT_EQ(kept.report.skipped(0).reason(), "folded value would be larger than the limit");
}

}  // namespace
}  // namespace onnxopt
