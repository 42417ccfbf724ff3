// fuse_conv_add_mul: it fires where it may, skips (with its reason) where it may not, and the
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

TEST(FuseConvAddMulTest, FoldsPerChannelScaleAndBias) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Conv", {"x", "w"}, {"c"});
  *graph.add_node() = MakeNode("Mul", {"c", "scale"}, {"m"});
  *graph.add_node() = MakeNode("Conv", {"m", "w2", "b2"}, {"c2"});
  *graph.add_node() = MakeNode("Add", {"shift", "c2"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {4, 3, 3, 3}, RandomFloats(108, 3));
  *graph.add_initializer() = FloatTensor("scale", {4, 1, 1}, RandomFloats(4, 4));
  *graph.add_initializer() = FloatTensor("w2", {2, 4, 1, 1}, RandomFloats(8, 5));
  *graph.add_initializer() = FloatTensor("b2", {2}, RandomFloats(2, 6));
  *graph.add_initializer() = FloatTensor("shift", {1, 2, 1, 1}, RandomFloats(2, 7));
  *graph.add_input() = FloatValue("x", {1, 3, 8, 8});
  *graph.add_output() = FloatValue("y", {1, 2, 6, 6});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_conv_add_mul"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 2}}));
  ExpectSameOutputs(original, run.model, 1e-4, 1e-4);
}

}  // namespace
}  // namespace onnxopt
