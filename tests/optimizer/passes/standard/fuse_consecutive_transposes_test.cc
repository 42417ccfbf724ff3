// fuse_consecutive_transposes: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;
using testing::PassRun;
using testing::RunPass;
using testing::WithIntsAttribute;

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

}  // namespace
}  // namespace onnxopt
