// unflatten_gemm: a product between a flattening and an unflattening Reshape (GPT-2's Conv1D Gemm, Keras'
// Dense MatMul as keras2onnx and tf2onnx write it) runs on the unflattened input instead, computing the
// same in ONNX Runtime.
#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

// x [2, 4, 16] -> Reshape [-1, 16] -> MatMul(W [16, 8]) -> Reshape [2, 4, 8] -> Add(b) -> y.
TEST(UnflattenGemmTest, AKerasDenseMatMulRunsOnTheUnflattenedInput) {
  onnx::GraphProto graph;
  *graph.add_input() = testing::FloatValue("x", {2, 4, 16});
  *graph.add_output() = testing::FloatValue("y", {2, 4, 8});
  *graph.add_initializer() = testing::FloatTensor("w", {16, 8}, testing::RandomFloats(128, 1));
  *graph.add_initializer() = testing::FloatTensor("b", {8}, testing::RandomFloats(8, 2));
  *graph.add_initializer() = MakeInt64Tensor("flat", {-1, 16});
  *graph.add_initializer() = MakeInt64Tensor("back", {2, 4, 8});
  *graph.add_node() = testing::MakeNode("Reshape", {"x", "flat"}, {"f"});
  *graph.add_node() = testing::MakeNode("MatMul", {"f", "w"}, {"g"});
  *graph.add_node() = testing::MakeNode("Reshape", {"g", "back"}, {"r"});
  *graph.add_node() = testing::MakeNode("Add", {"r", "b"}, {"y"});
  const onnx::ModelProto original = testing::MakeModel(graph, 17);
  testing::PassRun run = testing::RunPass("unflatten_gemm", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops.count("Reshape"), 0u);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "MatMul") EXPECT_EQ(node.input(0), "x");
  }
  testing::ExpectSameOutputs(original, run.model, 1e-6, 1e-5);
}

}  // namespace
}  // namespace onnxopt
