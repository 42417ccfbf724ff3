// fuse_reshape_chains: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <map>

#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
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
using testing::RunConfig;

TEST(FuseReshapeChainsTest, CollapsesChains) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Reshape", {"x", "s1"}, {"a"});
  *graph.add_node() = MakeNode("Reshape", {"a", "s2"}, {"b"});
  *graph.add_node() = MakeNode("Unsqueeze", {"b", "ax0"}, {"c"});
  *graph.add_node() = MakeNode("Unsqueeze", {"c", "ax2"}, {"d"});    // [1, 6, 1, 4]
  *graph.add_node() = MakeNode("Squeeze", {"d", "ax0"}, {"e"});      // [6, 1, 4]
  *graph.add_node() = MakeNode("Squeeze", {"e", "ax1"}, {"f"});      // [6, 4]
  *graph.add_node() = MakeNode("Unsqueeze", {"f", "ax1"}, {"g"});
  *graph.add_node() = MakeNode("Squeeze", {"g", "ax1"}, {"y"});      // cancels out
  *graph.add_initializer() = MakeInt64Tensor("s1", {4, 6});
  *graph.add_initializer() = MakeInt64Tensor("s2", {6, 4});
  *graph.add_initializer() = MakeInt64Tensor("ax0", {0});
  *graph.add_initializer() = MakeInt64Tensor("ax1", {1});
  *graph.add_initializer() = MakeInt64Tensor("ax2", {2});
  *graph.add_input() = FloatValue("x", {2, 12});
  *graph.add_output() = FloatValue("y", {6, 4});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"preset": "extended"})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Reshape", 1}})) << run.model.graph().DebugString();
  ExpectSameOutputs(original, run.model, 0, 0);
}

}  // namespace
}  // namespace onnxopt
