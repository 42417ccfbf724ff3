// eliminate_identity: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FixturePath;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;
using testing::PassRun;
using testing::RunPass;
using testing::SkipCount;

// x -> Relu -> Identity -> Neg -> y ; x -> Identity -> z (z is an output fed by an input)
onnx::ModelProto IdentityModel() {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *graph.add_node() = MakeNode("Identity", {"a"}, {"b"});
  *graph.add_node() = MakeNode("Neg", {"b"}, {"y"});
  *graph.add_node() = MakeNode("Identity", {"a"}, {"w"});  // output-feeding: renames Relu's output
  *graph.add_node() = MakeNode("Identity", {"x"}, {"z"});  // graph input straight to output: kept
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_output() = FloatValue("y", {2, 3});
  *graph.add_output() = FloatValue("w", {2, 3});
  *graph.add_output() = FloatValue("z", {2, 3});
  return MakeModel(graph);
}

TEST(EliminateIdentityTest, RemovesIdentitiesAndKeepsOutputNames) {
  const onnx::ModelProto original = IdentityModel();
  PassRun run = RunPass("eliminate_identity", original);
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(SkipCount(run.report, "graph output"), 1);
  EXPECT_EQ(OpCounts(run.model)["Identity"], 1);
  EXPECT_EQ(run.model.graph().output(1).name(), "w");
  ExpectSameOutputs(original, run.model);
}

TEST(EliminateIdentityTest, FiresOnExportedEncoderAndKeepsItsOutputs) {
  auto original = LoadModel(FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  PassRun run = RunPass("eliminate_identity", *original);
  EXPECT_EQ(run.report.rewrites(), 8);
  EXPECT_EQ(run.report.op_delta().at("Identity"), -8);
  EXPECT_EQ(run.report.nodes_before() - run.report.nodes_after(), 8);
  ExpectSameOutputs(*original, run.model, 1e-6, 1e-6);
}

}  // namespace
}  // namespace onnxopt
