// fuse_transpose_into_gemm: it fires where it may, skips (with its reason) where it may not, and the
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

TEST(FuseTransposeIntoGemmTest, FoldsTransposesIntoGemmAttributes) {
  onnx::GraphProto graph;
  onnx::NodeProto t1 = MakeNode("Transpose", {"a"}, {"at"});
  auto* perm = t1.add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::INTS);
  perm->add_ints(1);
  perm->add_ints(0);
  onnx::NodeProto t2 = t1;
  t2.set_input(0, "w");
  t2.set_output(0, "wt");
  t2.set_name("t2");
  *graph.add_node() = t1;
  *graph.add_node() = t2;
  onnx::NodeProto gemm = MakeNode("Gemm", {"at", "w", "c"}, {"g"});
  auto* trans_b = gemm.add_attribute();
  trans_b->set_name("transB");
  trans_b->set_type(onnx::AttributeProto::INT);
  trans_b->set_i(1);
  *graph.add_node() = gemm;
  *graph.add_node() = MakeNode("MatMul", {"g", "wt"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {3, 3}, RandomFloats(9, 21));
  *graph.add_initializer() = FloatTensor("c", {3}, RandomFloats(3, 22));
  *graph.add_input() = FloatValue("a", {3, 4});
  *graph.add_output() = FloatValue("y", {4, 3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_transpose_into_gemm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Gemm", 2}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace
}  // namespace onnxopt
