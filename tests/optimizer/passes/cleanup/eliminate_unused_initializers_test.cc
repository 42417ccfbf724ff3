// eliminate_unused_initializers: it fires where it may, skips (with its reason) where it may not, and the
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
using testing::SkipCount;

TEST(EliminateUnusedInitializersTest, DropsUnusedKeepsInterfaceInitializers) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "bias"}, {"y"});
  *graph.add_initializer() = FloatTensor("bias", {2}, {1, 2});
  *graph.add_initializer() = FloatTensor("unused", {2}, {3, 4});
  *graph.add_initializer() = FloatTensor("overridable", {2}, {5, 6});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_input() = FloatValue("overridable", {2});
  *graph.add_output() = FloatValue("y", {2});
  const onnx::ModelProto original = MakeModel(graph);
  PassRun run = RunPass("eliminate_unused_initializers", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(SkipCount(run.report, "graph input"), 1);
  ASSERT_EQ(run.model.graph().initializer_size(), 2);
  EXPECT_EQ(run.model.graph().initializer(0).name(), "bias");
  EXPECT_EQ(run.model.graph().initializer(1).name(), "overridable");
  ExpectSameOutputs(original, run.model);
}

}  // namespace
}  // namespace onnxopt
