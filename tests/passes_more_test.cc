// Tests for the no-op, folding, CSE, duplicate-initializer, Range/Gather, Conv+BN and Transpose
// passes: each fires where it may, skips where it may not, and keeps the outputs in ONNX Runtime.
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_manager.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"
#include "tests/parity_matchers.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::PassRun;
using testing::RunConfig;
using testing::RunPass;
using testing::WithIntsAttribute;
using testing::WithIntAttribute;
using testing::RandomFloats;
using testing::OpCounts;
using testing::MakeValue;

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

TEST(EliminateDuplicateInitializersTest, MergesEqualContents) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "w1"}, {"a"});
  *graph.add_node() = MakeNode("Mul", {"a", "w2"}, {"b"});
  *graph.add_node() = MakeNode("Sub", {"b", "w3"}, {"y"});
  *graph.add_initializer() = FloatTensor("w1", {2}, {1, 2});
  *graph.add_initializer() = FloatTensor("w2", {2}, {1, 2});
  *graph.add_initializer() = FloatTensor("w3", {2}, {2, 1});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_output() = FloatValue("y", {2});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("eliminate_duplicate_initializers", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(run.model.graph().initializer_size(), 2);
  EXPECT_EQ(run.model.graph().node(1).input(1), "w1");
  ExpectSameOutputs(original, run.model);
}

// data [4, 6, 5] -> Gather(axis 1, Range(start, limit, delta))
onnx::ModelProto RangeGatherModel(int64_t start, int64_t delta, std::optional<int64_t> limit) {
  onnx::GraphProto graph;
  *graph.add_initializer() = MakeInt64Tensor("start", {start});
  graph.mutable_initializer(0)->clear_dims();  // scalar
  *graph.add_initializer() = MakeInt64Tensor("delta", {delta});
  graph.mutable_initializer(1)->clear_dims();
  if (limit) {
    *graph.add_initializer() = MakeInt64Tensor("limit", {*limit});
    graph.mutable_initializer(2)->clear_dims();
  } else {  // the size of dim 2 of x, a value only known at run time
    *graph.add_node() = MakeNode("Shape", {"x"}, {"shape"});
    *graph.add_initializer() = MakeInt64Tensor("two", {2});
    graph.mutable_initializer(2)->clear_dims();
    *graph.add_node() = MakeNode("Gather", {"shape", "two"}, {"limit"});
  }
  *graph.add_node() = MakeNode("Range", {"start", "limit", "delta"}, {"indices"});
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"x", "indices"}, {"y"}), "axis", 1);
  *graph.add_input() = FloatValue("x", {4, 6, 5});
  onnx::ValueInfoProto output = FloatValue("y", {});
  output.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = output;
  return MakeModel(graph, 13);
}

TEST(GatherRangeToSliceTest, RewritesExactlyWhenBothAgree) {
  struct Case {
    int64_t start, delta;
    std::optional<int64_t> limit;
    bool fires;
  };
  for (const Case& c : std::vector<Case>{{0, 1, 6, true},
                                         {1, 2, 6, true},
                                         {3, 1, 2, true},          // empty range, empty slice
                                         {0, 1, std::nullopt, true},  // limit = a size
                                         {5, -1, -1, true},        // down to index 0
                                         {4, -2, 0, true},
                                         {-2, 1, 2, false},        // negative indices wrap in Gather
                                         {0, 1, -1, false}}) {     // Slice would read -1 as "dim - 1"
    const onnx::ModelProto original = RangeGatherModel(c.start, c.delta, c.limit);
    PassRun run = RunPass("gather_range_to_slice", original);
    const std::string where = ::testing::PrintToString(std::make_tuple(c.start, c.delta, c.limit.value_or(-99)));
    EXPECT_EQ(run.report.rewrites(), c.fires ? 1 : 0) << where;
    if (!c.fires) continue;
    EXPECT_EQ(OpCounts(run.model).count("Range"), 0u) << where;
    EXPECT_EQ(OpCounts(run.model)["Slice"], 1) << where;
    ExpectSameOutputs(original, run.model, 0, 0);
  }
}

// Constant indices that count in steps (what fold_constants makes of a static Range) slice too.
TEST(GatherRangeToSliceTest, ConstantProgressionsSliceToo) {
  struct Case {
    std::vector<int64_t> indices;
    bool fires;
  };
  for (const Case& c : std::vector<Case>{{{0, 1, 2, 3}, true},
                                         {{1, 3, 5}, true},
                                         {{4}, true},              // one index: a slice of one
                                         {{5, 4, 3, 2, 1, 0}, true},  // down to index 0
                                         {{4, 2}, true},
                                         {{0, 2, 3}, false},       // not one step
                                         {{1, 1}, false},          // step 0 repeats a row
                                         {{-1, 0}, false}}) {      // negative indices wrap in Gather
    onnx::GraphProto graph;
    *graph.add_initializer() = MakeInt64Tensor("indices", c.indices);
    *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"x", "indices"}, {"y"}), "axis", 1);
    *graph.add_input() = FloatValue("x", {4, 6, 5});
    onnx::ValueInfoProto output = FloatValue("y", {});
    output.mutable_type()->mutable_tensor_type()->clear_shape();
    *graph.add_output() = output;
    const onnx::ModelProto original = MakeModel(graph, 13);
    PassRun run = RunPass("gather_range_to_slice", original);
    const std::string where = ::testing::PrintToString(c.indices);
    EXPECT_EQ(run.report.rewrites(), c.fires ? 1 : 0) << where;
    if (!c.fires) continue;
    EXPECT_EQ(OpCounts(run.model).count("Gather"), 0u) << where;
    ExpectSameOutputs(original, run.model, 0, 0);
  }
  // The seed fix: the transformer preset folds a static Range before gather_range_to_slice runs; the
  // Gather still becomes a Slice.
  const onnx::ModelProto original = RangeGatherModel(1, 2, 6);
  PassRun preset = testing::RunConfig(R"({"preset": "transformer"})", original);
  ASSERT_TRUE(preset.status.ok()) << preset.status;
  EXPECT_EQ(OpCounts(preset.model).count("Gather"), 0u);
  EXPECT_EQ(OpCounts(preset.model)["Slice"], 1);
  ExpectSameOutputs(original, preset.model, 0, 0);
}

TEST(FuseConvBatchNormTest, FoldsInferenceBatchNorm) {
  for (bool conv_bias : {true, false}) {
    onnx::GraphProto graph;
    std::vector<std::string> conv_inputs = {"x", "w"};
    if (conv_bias) conv_inputs.push_back("b");
    *graph.add_node() = WithIntsAttribute(MakeNode("Conv", conv_inputs, {"c"}), "pads", {1, 1, 1, 1});
    *graph.add_node() = MakeNode("BatchNormalization", {"c", "scale", "bias", "mean", "var"}, {"y"});
    *graph.add_initializer() = FloatTensor("w", {4, 3, 3, 3}, RandomFloats(108, 2));
    *graph.add_initializer() = FloatTensor("b", {4}, RandomFloats(4, 3));
    *graph.add_initializer() = FloatTensor("scale", {4}, RandomFloats(4, 4));
    *graph.add_initializer() = FloatTensor("bias", {4}, RandomFloats(4, 5));
    *graph.add_initializer() = FloatTensor("mean", {4}, RandomFloats(4, 6));
    *graph.add_initializer() = FloatTensor("var", {4}, {0.5f, 1.0f, 2.0f, 0.1f});
    *graph.add_input() = FloatValue("x", {1, 3, 8, 8});
    *graph.add_output() = FloatValue("y", {1, 4, 8, 8});
    const onnx::ModelProto original = MakeModel(graph, 13);
    PassRun run = RunPass("fuse_conv_batchnorm", original);
    EXPECT_EQ(run.report.rewrites(), 1) << conv_bias;
    EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 1}})) << conv_bias;
    ExpectSameOutputs(original, run.model, 1e-4, 1e-4);
  }
}

TEST(FuseConsecutiveTransposesTest, ComposesAndCancels) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"x"}, {"a"}), "perm", {0, 2, 1});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"a"}, {"b"}), "perm", {2, 0, 1});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"x"}, {"c"}), "perm", {1, 0, 2});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"c"}, {"d"}), "perm", {1, 0, 2});
  *graph.add_node() = MakeNode("Relu", {"d"}, {"e"});
  *graph.add_input() = FloatValue("x", {2, 3, 4});
  *graph.add_output() = FloatValue("b", {3, 2, 4});
  *graph.add_output() = FloatValue("e", {2, 3, 4});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("fuse_consecutive_transposes", original);
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(OpCounts(run.model)["Transpose"], 1);
  ExpectSameOutputs(original, run.model, 0, 0);
}

TEST(ExtendedPresetTest, KeepsTheConformanceFixturesExact) {
  for (const char* name : {"bert_tiny.onnx", "cnn_tiny.onnx"}) {
    auto original = LoadModel(testing::FixturePath(name));
    ASSERT_TRUE(original.ok());
    v1::OptimizationConfig config;
    config.set_preset("extended");
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    ASSERT_TRUE(pipeline.ok());
    onnx::ModelProto model = *original;
    std::vector<v1::PassReport> reports;
    ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
    EXPECT_LE(model.graph().node_size(), original->graph().node_size()) << name;
    ExpectSameOutputs(*original, model, 1e-5, 1e-4);
  }
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

// Each seed pass fires on a model PyTorch exported with the pattern (tests/fixtures/make_fixtures.py)
// and the result matches the original in ONNX Runtime.
TEST(PyTorchExportsTest, SeedPassesFireOnRealExports) {
  struct Case {
    const char* fixture;
    const char* pass;
    int64_t min_rewrites;
  };
  for (const Case& c : std::vector<Case>{{"bert_tiny.onnx", "eliminate_identity", 8},
                                         {"bert_tiny.onnx", "fold_constants", 73},
                                         {"bert_tiny.onnx", "eliminate_common_subexpressions", 8},
                                         {"constants_heavy.onnx", "fold_constants", 14},
                                         {"index_select_arange.onnx", "gather_range_to_slice", 1},
                                         {"cnn_bn.onnx", "fuse_conv_batchnorm", 3}}) {
    auto original = LoadModel(testing::FixturePath(c.fixture));
    ASSERT_TRUE(original.ok()) << c.fixture;
    // The pass after the basic cleanups, as in the extended preset.
    v1::OptimizationConfig config;
    for (const char* name : {"eliminate_identity", "fold_constants", "eliminate_dead_nodes", c.pass}) {
      config.add_passes()->set_name(name);
    }
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    ASSERT_TRUE(pipeline.ok());
    onnx::ModelProto model = *original;
    std::vector<v1::PassReport> reports;
    ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
    int64_t rewrites = 0;
    for (const auto& report : reports) {
      if (report.name() == c.pass) rewrites = std::max(rewrites, report.rewrites());
    }
    EXPECT_GE(rewrites, c.min_rewrites) << c.fixture << " " << c.pass;
    ExpectSameOutputs(*original, model, 1e-5, 1e-4);
  }
}

}  // namespace
}  // namespace onnxopt
