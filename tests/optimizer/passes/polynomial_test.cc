// polynomial: a value recognized as a polynomial of one variable by what it computes.
#include "optimizer/passes/polynomial.h"

#include <cmath>

#include "gtest/gtest.h"
#include "optimizer/graph.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FloatTensor;
using testing::MakeNode;

onnx::GraphProto WithScalars(onnx::GraphProto graph) {
  for (const auto& [name, value] : std::vector<std::pair<std::string, float>>{{"two", 2}, {"three", 3}, {"half", 0.5f}}) {
    *graph.add_initializer() = FloatTensor(name, {}, {value});
  }
  *graph.add_initializer() = FloatTensor("bias", {4}, {1, 2, 3, 4});
  *graph.add_input() = testing::FloatValue("h", {2, 4});
  return graph;
}

TEST(PolynomialTest, ReadsEverySpellingOfOnePolynomial) {
  onnx::GraphProto graph;
  // x = h + bias[4] (two non-scalars: x is the variable); p = -(0.5 * (x - x^3 / 2)).
  *graph.add_node() = MakeNode("Add", {"h", "bias"}, {"x"});
  *graph.add_node() = MakeNode("Pow", {"x", "three"}, {"cube"});
  *graph.add_node() = MakeNode("Div", {"cube", "two"}, {"half_cube"});
  *graph.add_node() = MakeNode("Sub", {"x", "half_cube"}, {"d"});
  *graph.add_node() = MakeNode("Mul", {"half", "d"}, {"scaled"});
  *graph.add_node() = MakeNode("Neg", {"scaled"}, {"p"});
  auto model = testing::MakeModel(WithScalars(graph), 17);
  Graph ir(model.mutable_graph());
  std::optional<Polynomial> p = PolynomialOf(ir, "p");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->variable, "x");
  EXPECT_TRUE(p->Is({{1, -0.5}, {3, 0.25}}, 1e-9)) << p->coefficients[1] << " " << p->coefficients[3];
  EXPECT_EQ(p->nodes.size(), 5u) << "the Add computing x is the variable's, not the polynomial's";
  EXPECT_FALSE(p->Is({{1, -0.5}}, 1e-9)) << "every term counts";
}

// Where the expansion would read a second variable, another operator or degree 6, the value stops there:
// it is the variable of its own polynomial, which no Gelu argument matches.
TEST(PolynomialTest, StopsWhereTheExpansionWouldLeaveOneVariable) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Mul", {"h", "bias"}, {"scaled"});
  *graph.add_node() = MakeNode("Add", {"h", "scaled"}, {"sum"});
  *graph.add_node() = MakeNode("Tanh", {"h"}, {"t"});
  *graph.add_node() = MakeNode("Mul", {"t", "h"}, {"mixed"});
  *graph.add_node() = MakeNode("Pow", {"h", "three"}, {"cube"});
  *graph.add_node() = MakeNode("Mul", {"cube", "cube"}, {"sixth"});
  *graph.add_node() = MakeNode("Mul", {"sixth", "two"}, {"doubled"});
  auto model = testing::MakeModel(WithScalars(graph), 17);
  Graph ir(model.mutable_graph());
  for (const char* value : {"sum", "mixed", "sixth"}) {
    std::optional<Polynomial> p = PolynomialOf(ir, value);
    ASSERT_TRUE(p.has_value()) << value;
    EXPECT_EQ(p->variable, value);
    EXPECT_TRUE(p->Is({{1, 1}}, 0)) << value;
    EXPECT_TRUE(p->nodes.empty()) << value;
  }
  std::optional<Polynomial> doubled = PolynomialOf(ir, "doubled");
  ASSERT_TRUE(doubled.has_value());
  EXPECT_EQ(doubled->variable, "sixth") << "degree 6 of h is too high: sixth is the variable";
  EXPECT_TRUE(doubled->Is({{1, 2}}, 1e-9));
  EXPECT_FALSE(PolynomialOf(ir, "two").has_value()) << "a constant";
}

}  // namespace
}  // namespace onnxopt
