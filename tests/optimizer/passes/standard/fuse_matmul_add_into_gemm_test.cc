// fuse_matmul_add_into_gemm: it fires where it may, skips (with its reason) where it may not, and the
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

TEST(FuseMatMulAddIntoGemmTest, FusesOnlyTwoDimensionalMatMuls) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Add", {"bias", "m"}, {"y"});
  *graph.add_node() = MakeNode("MatMul", {"x3", "w"}, {"m3"});
  *graph.add_node() = MakeNode("Add", {"m3", "bias"}, {"y3"});
  *graph.add_initializer() = FloatTensor("w", {4, 3}, RandomFloats(12, 1));
  *graph.add_initializer() = FloatTensor("bias", {3}, RandomFloats(3, 2));
  *graph.add_input() = FloatValue("x", {5, 4});
  *graph.add_input() = FloatValue("x3", {2, 5, 4});
  *graph.add_output() = FloatValue("y", {5, 3});
  *graph.add_output() = FloatValue("y3", {2, 5, 3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_matmul_add_into_gemm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Add", 1}, {"Gemm", 1}, {"MatMul", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace
}  // namespace onnxopt
