// The declarative matcher (optimizer/passes/match.h): paths read upwards with operands in either
// order, whole-path checks that send the matcher on to the next order, failures with and without a
// reason, and the helpers that parse what passes read (Slices, scalar operands).
#include "optimizer/passes/match.h"

#include "gtest/gtest.h"
#include "optimizer/graph.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

// Holds a model and the Graph over it for one test.
struct Built {
  explicit Built(onnx::GraphProto graph) : model(MakeModel(std::move(graph))), graph(model.mutable_graph()) {}
  onnx::ModelProto model;
  Graph graph;
};

onnx::GraphProto ProjectionGraph(bool bias_first) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 4});
  *graph.add_initializer() = FloatTensor("w", {4, 4}, std::vector<float>(16, 0.5f));
  *graph.add_initializer() = FloatTensor("b", {4}, {1, 2, 3, 4});
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"xw"});
  *graph.add_node() = MakeNode("Add", bias_first ? std::vector<std::string>{"b", "xw"} : std::vector<std::string>{"xw", "b"},
                               {"y"});
  *graph.add_output() = FloatValue("y", {2, 4});
  return graph;
}

TEST(MatchPathTest, AnyInputTakesTheOperandsInEitherOrder) {
  for (bool bias_first : {false, true}) {
    Built built(ProjectionGraph(bias_first));
    std::optional<PathMatch> path = MatchPath(built.graph, "y", {{"Add", kAnyInput}, {"MatMul"}});
    ASSERT_TRUE(path.has_value()) << bias_first;
    EXPECT_EQ(path->nodes[0]->op_type(), "Add");
    EXPECT_EQ(path->nodes[1]->op_type(), "MatMul");
    EXPECT_EQ(path->followed[0], bias_first ? 1 : 0);
    EXPECT_EQ(path->Other(0), "b");
    EXPECT_EQ(path->end, "x");
  }
  Built built(ProjectionGraph(false));
  EXPECT_FALSE(MatchPath(built.graph, "y", {{"Add", 0}, {"Gemm"}}).has_value());
  EXPECT_FALSE(MatchPath(built.graph, "y", {{"Add", 1}, {"MatMul"}}).has_value()) << "input 1 is the bias";
  EXPECT_FALSE(MatchPath(built.graph, "x", {{"Add", kAnyInput}}).has_value()) << "a graph input has no producer";
}

// x = h * h, then c = Mul(x, Mul(x, x)): following input 0 of the outer Mul reaches Mul(h, h), which
// is a square too, but not of the outer Mul's other operand; the whole-path check rejects that order
// and the matcher goes on to input 1.
TEST(MatchPathTest, AWholePathCheckSendsTheMatcherToTheNextOrder) {
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("h", {3});
  *proto.add_node() = MakeNode("Mul", {"h", "h"}, {"x"});
  *proto.add_node() = MakeNode("Mul", {"x", "x"}, {"square"});
  *proto.add_node() = MakeNode("Mul", {"x", "square"}, {"cube"});
  *proto.add_output() = FloatValue("cube", {3});
  Built built(std::move(proto));
  auto squares = [](const Graph&, const Node& node, int) { return node.input(0) == node.input(1); };
  int candidates = 0;
  std::optional<PathMatch> path =
      MatchPath(built.graph, "cube", {{"Mul", kAnyInput}, {"Mul", 0, squares}}, [&](const PathMatch& found) {
        ++candidates;
        return found.Other(0) == found.end;
      });
  ASSERT_TRUE(path.has_value());
  EXPECT_EQ(candidates, 2) << "the first order reached Mul(h, h) and was rejected";
  EXPECT_EQ(path->followed[0], 1);
  EXPECT_EQ(path->end, "x");
  EXPECT_EQ(path->nodes[1]->output(0), "square");
}

TEST(MatchPathTest, StepChecksSeeTheOperandTheyDoNotFollow) {
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("x", {3});
  *proto.add_initializer() = FloatTensor("half", {}, {0.5f});
  *proto.add_node() = MakeNode("Mul", {"half", "x"}, {"y"});
  *proto.add_output() = FloatValue("y", {3});
  Built built(std::move(proto));
  std::optional<PathMatch> path = MatchPath(built.graph, "y", {{"Mul", kAnyInput, OtherIsScalar(0.5, 1e-6)}});
  ASSERT_TRUE(path.has_value());
  EXPECT_EQ(path->end, "x");
  EXPECT_FALSE(MatchPath(built.graph, "y", {{"Mul", kAnyInput, OtherIsScalar(0.25, 1e-6)}}).has_value());
  EXPECT_EQ(OperandBesideScalar(built.graph, built.graph.Producer("y"), "Mul", 0.5, 1e-6), "x");
  EXPECT_FALSE(OperandBesideScalar(built.graph, built.graph.Producer("y"), "Add", 0.5, 1e-6).has_value());
  const auto scale = ScalarScale(built.graph, built.graph.Producer("y"));
  ASSERT_TRUE(scale.has_value());
  EXPECT_FLOAT_EQ(scale->first, 0.5f);
  EXPECT_EQ(scale->second, "x");
}

MatchResult<int> Halve(int value) {
  if (value % 2 != 0) return Fail("odd");
  if (value == 0) return Fail();
  return value / 2;
}

MatchResult<std::string> HalveTwice(int value) {
  MatchResult<int> once = Halve(value);
  if (!once) return once.failure();
  MatchResult<int> twice = Halve(*once);
  if (!twice) return twice.failure();
  return std::to_string(*twice);
}

TEST(MatchResultTest, CarriesAValueOrAReasonAcrossTypes) {
  EXPECT_EQ(*HalveTwice(12), "3");
  EXPECT_FALSE(HalveTwice(6));
  EXPECT_EQ(HalveTwice(6).reason(), "odd") << "the inner failure's reason reaches the caller";
  EXPECT_FALSE(HalveTwice(0));
  EXPECT_TRUE(HalveTwice(0).reason().empty()) << "no reason: not this pattern, nothing to report";
}

TEST(ParseSliceTest, FillsInTheDefaultsAndKeepsComputedBounds) {
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("x", {4, 6});
  *proto.add_input() = testing::MakeValue("end", onnx::TensorProto::INT64, {1});
  *proto.add_initializer() = MakeInt64Tensor("starts", {1, 0});
  *proto.add_initializer() = MakeInt64Tensor("ends", {3, 5});
  *proto.add_initializer() = MakeInt64Tensor("zero", {0});
  *proto.add_initializer() = MakeInt64Tensor("last", {-1});
  *proto.add_initializer() = MakeInt64Tensor("two", {2});
  *proto.add_node() = MakeNode("Slice", {"x", "starts", "ends"}, {"a"});               // axes and steps default
  *proto.add_node() = MakeNode("Slice", {"x", "zero", "end", "last"}, {"b"});          // a computed end
  *proto.add_node() = MakeNode("Slice", {"x", "zero", "end", "last", "two"}, {"c"});   // step 2
  *proto.add_node() = MakeNode("Slice", {"x", "end", "end"}, {"d"});                   // how many axes?
  for (const char* out : {"a", "b", "c", "d"}) *proto.add_output() = FloatValue(out, {});
  Built built(std::move(proto));
  auto parse = [&](const char* value) { return ParseSlice(built.graph, *built.graph.Producer(value)); };
  const std::optional<SliceSpec> a = parse("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->axes, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(a->steps, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(a->ends, (std::vector<int64_t>{3, 5}));
  const std::optional<SliceSpec> b = parse("b");
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->ends.has_value());
  EXPECT_TRUE(b->OneAxis(1, 2)) << "-1 of a rank-2 input is axis 1";
  EXPECT_TRUE(b->OneAxis(-1, 2));
  EXPECT_FALSE(b->OneAxis(0, 2));
  const std::optional<SliceSpec> c = parse("c");
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->OneAxis(-1, 2)) << "a step of 2";
  EXPECT_FALSE(parse("d").has_value()) << "without axes and with computed starts the count of axes is unknown";
}

TEST(OnlyPatternReadsTest, AValueReadOutsideOrReturnedKeepsThePattern) {
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("x", {3});
  *proto.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *proto.add_node() = MakeNode("Neg", {"a"}, {"b"});
  *proto.add_node() = MakeNode("Abs", {"a"}, {"c"});
  *proto.add_output() = FloatValue("b", {3});
  *proto.add_output() = FloatValue("c", {3});
  Built built(std::move(proto));
  Node* relu = built.graph.Producer("a");
  Node* neg = built.graph.Producer("b");
  Node* abs = built.graph.Producer("c");
  EXPECT_FALSE(OnlyPatternReads(built.graph, {relu, neg}, "b")) << "Abs reads a";
  EXPECT_FALSE(OnlyPatternReads(built.graph, {relu, neg, abs}, "b")) << "c is a graph output";
  EXPECT_TRUE(OnlyPatternReads(built.graph, {neg}, "b"));
}

}  // namespace
}  // namespace onnxopt
