// lower_einsum: two-operand Einsums become MatMul between Transposes and Reshapes, equal in ONNX Runtime,
// with batch, contracted and free axes in any order and dims symbolic where they stay unflattened; what
// is not a product (a diagonal, a sum over one operand) stays an Einsum.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;

struct Operand {
  std::vector<int64_t> dims;  // -1: a symbolic dim (named after its letter)
  bool constant = false;
};

onnx::ValueInfoProto Value(const std::string& name, const std::string& term, const std::vector<int64_t>& dims) {
  onnx::ValueInfoProto value = testing::FloatValue(name, {});
  auto* shape = value.mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->clear_dim();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      shape->add_dim()->set_dim_param(std::string("dim_") + term[i]);
    } else {
      shape->add_dim()->set_dim_value(dims[i]);
    }
  }
  return value;
}

// y = Einsum(equation, a, b), each operand an input or a constant.
onnx::ModelProto EinsumModel(const std::string& equation, const Operand& a, const Operand& b) {
  const std::string terms = equation.substr(0, equation.find("->"));
  const std::string term_a = terms.substr(0, terms.find(',')), term_b = terms.substr(terms.find(',') + 1);
  onnx::GraphProto graph;
  int seed = 1;
  for (const auto& [name, operand, term] : {std::tuple{"a", a, term_a}, std::tuple{"b", b, term_b}}) {
    if (operand.constant) {
      int64_t elements = 1;
      for (int64_t dim : operand.dims) elements *= dim;
      *graph.add_initializer() = testing::FloatTensor(name, operand.dims, testing::RandomFloats(elements, seed++));
    } else {
      *graph.add_input() = Value(name, term, operand.dims);
    }
  }
  onnx::NodeProto einsum = MakeNode("Einsum", {"a", "b"}, {"y"});
  onnx::AttributeProto* attribute = einsum.add_attribute();
  attribute->set_name("equation");
  attribute->set_type(onnx::AttributeProto::STRING);
  attribute->set_s(equation);
  *graph.add_node() = einsum;
  onnx::ValueInfoProto output = testing::FloatValue("y", {});
  output.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = output;
  return MakeModel(graph, 17);
}

struct Case {
  std::string equation;
  Operand a, b;
};

class LowerEinsumTest : public ::testing::TestWithParam<Case> {};

TEST_P(LowerEinsumTest, BecomesAMatMulComputingTheSame) {
  const Case& c = GetParam();
  const onnx::ModelProto original = EinsumModel(c.equation, c.a, c.b);
  testing::PassRun run = testing::RunPass("lower_einsum", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("Einsum"), 0u);
  EXPECT_EQ(ops["MatMul"], 1);
  testing::ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
}

constexpr int64_t kSymbolic = -1;
INSTANTIATE_TEST_SUITE_P(
    Equations, LowerEinsumTest,
    ::testing::Values(
        // Keras' EinsumDense: [B, S, H] x [H, N, D], the batch and sequence symbolic.
        Case{"abc,cde->abde", {{kSymbolic, kSymbolic, 8}}, {{8, 2, 4}, true}},
        // Its output projection, [B, S, N, D] x [N, D, H]: two contracted axes.
        Case{"abcd,cde->abe", {{kSymbolic, 5, 2, 4}}, {{2, 4, 8}, true}},
        // layers.MultiHeadAttention's scores (keys first) and context.
        Case{"aecd,abcd->acbe", {{2, 5, 3, 4}}, {{2, 6, 3, 4}}},
        Case{"acbe,aecd->abcd", {{2, 3, 6, 5}}, {{2, 5, 3, 4}}},
        // A plain batched product, one in another order, and an outer dim on each side.
        Case{"bij,bjk->bik", {{kSymbolic, 3, 4}}, {{kSymbolic, 4, 5}}},
        Case{"ij,kj->ki", {{3, 4}}, {{5, 4}}},
        Case{"abi,ij->jab", {{2, 3, 4}}, {{4, 5}, true}}),
    [](const ::testing::TestParamInfo<Case>& info) { return "case" + std::to_string(info.index); });

TEST(LowerEinsumRefusalTest, WhatIsNotAProductStays) {
  for (const auto& [equation, a, b] : {std::tuple{"ij,jk->i", Operand{{3, 4}}, Operand{{4, 5}}},   // k summed alone
                                       std::tuple{"ii,ij->ij", Operand{{3, 3}}, Operand{{3, 4}}},  // a diagonal
                                       std::tuple{"ij,j->i", Operand{{3, 4}}, Operand{{4}}},       // no free axis in b
                                       std::tuple{"...j,jk->...k", Operand{{3, 4}}, Operand{{4, 5}}}}) {
    testing::PassRun run = testing::RunPass("lower_einsum", EinsumModel(equation, a, b));
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.report.rewrites(), 0) << equation;
    EXPECT_EQ(OpCounts(run.model)["Einsum"], 1) << equation;
  }
}

// Flattening two free axes of unknown size beside batch axes needs their product: skipped, with why.
TEST(LowerEinsumRefusalTest, UnknownSizesThatWouldBeFlattenedAreSkippedWithTheReason) {
  testing::PassRun run =
      testing::RunPass("lower_einsum", EinsumModel("bxyk,bkz->bxyz", {{2, kSymbolic, kSymbolic, 4}}, {{2, 4, 3}}));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::SkipCount(run.report, "free axes' sizes are unknown beside batch axes"), 1);
}

}  // namespace
}  // namespace onnxopt
