// One test group per seed pass: it fires where it may, skips (with its reason) where it may not,
// and the rewritten model computes the same outputs in ONNX Runtime.
#include <map>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_manager.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"
#include "tests/parity_matchers.h"

namespace onnxopt {
namespace {

using testing::BoolScalar;
using testing::ExpectSameOutputs;
using testing::FixturePath;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::PassRun;
using testing::RunPass;
using testing::OpCounts;

int64_t SkipCount(const v1::PassReport& report, const std::string& reason_part) {
  int64_t count = 0;
  for (const auto& skip : report.skipped()) {
    if (skip.reason().find(reason_part) != std::string::npos) count += skip.count();
  }
  return count;
}

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

onnx::ModelProto DropoutModel(int64_t opset, bool training_flag, bool use_mask) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  std::vector<std::string> inputs = {"a"};
  if (opset >= 12) {
    *graph.add_initializer() = FloatTensor("ratio", {}, {0.5f});
    *graph.add_initializer() = BoolScalar("training", training_flag);
    inputs = {"a", "ratio", "training"};
  }
  *graph.add_node() = MakeNode("Dropout", inputs, {"b", "mask"});
  *graph.add_node() = MakeNode("Neg", {"b"}, {"y"});
  *graph.add_input() = FloatValue("x", {4});
  *graph.add_output() = FloatValue("y", {4});
  if (use_mask) *graph.add_output() = testing::MakeValue("mask", onnx::TensorProto::BOOL, {4});
  return MakeModel(graph, opset);
}

TEST(EliminateDropoutTest, RemovesInferenceDropout) {
  for (int64_t opset : {11, 13}) {
    const onnx::ModelProto original = DropoutModel(opset, false, false);
    PassRun run = RunPass("eliminate_dropout", original);
    EXPECT_EQ(run.report.rewrites(), 1) << "opset " << opset;
    EXPECT_EQ(OpCounts(run.model)["Dropout"], 0);
    ExpectSameOutputs(original, run.model);
  }
}

TEST(EliminateDropoutTest, KeepsTrainingDropoutAndUsedMasks) {
  PassRun training = RunPass("eliminate_dropout", DropoutModel(13, true, false));
  EXPECT_EQ(training.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(training.report, "training_mode"), 1);

  PassRun mask = RunPass("eliminate_dropout", DropoutModel(13, false, true));
  EXPECT_EQ(mask.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(mask.report, "mask"), 1);
}

TEST(EliminateDropoutTest, LeavesExportedTrainingModeDropoutAlone) {
  auto original = LoadModel(FixturePath("bert_tiny_train.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunPass("eliminate_dropout", *original);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(SkipCount(run.report, "training_mode"), 7);
}

TEST(EliminateDeadNodesTest, RemovesUnusedChainsButNotUnknownDomains) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *graph.add_node() = MakeNode("Neg", {"a"}, {"dead1"});
  *graph.add_node() = MakeNode("Abs", {"dead1"}, {"dead2"});
  onnx::NodeProto custom = MakeNode("Logger", {"a"}, {"side"});
  custom.set_domain("com.example");
  *graph.add_node() = custom;
  *graph.add_node() = MakeNode("Sigmoid", {"a"}, {"y"});
  *graph.add_input() = FloatValue("x", {3});
  *graph.add_output() = FloatValue("y", {3});
  onnx::ModelProto model = MakeModel(graph);
  auto* custom_opset = model.add_opset_import();
  custom_opset->set_domain("com.example");
  custom_opset->set_version(1);
  PassRun run = RunPass("eliminate_dead_nodes", model);
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(SkipCount(run.report, "unknown domain"), 1);
  EXPECT_EQ(run.model.graph().node_size(), 3);
}

// Stored out of order, a dead reader comes after its producer in the backward sweep: the producer
// is looked at again and goes too.
TEST(EliminateDeadNodesTest, RemovesADeadChainStoredOutOfOrder) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Abs", {"dead1"}, {"dead2"});
  *graph.add_node() = MakeNode("Neg", {"a"}, {"dead1"});
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *graph.add_node() = MakeNode("Sigmoid", {"x"}, {"y"});
  *graph.add_input() = FloatValue("x", {3});
  *graph.add_output() = FloatValue("y", {3});
  PassRun run = RunPass("eliminate_dead_nodes", MakeModel(graph));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 3);
  ASSERT_EQ(run.model.graph().node_size(), 1);
  EXPECT_EQ(run.model.graph().node(0).op_type(), "Sigmoid");
}

TEST(EliminateDeadNodesTest, KeepsNodesReadOnlyByASubgraph) {
  onnx::GraphProto body;
  *body.add_node() = MakeNode("Neg", {"a"}, {"t"});
  *body.add_output() = FloatValue("t", {3});
  onnx::GraphProto other = body;
  other.mutable_node(0)->set_op_type("Abs");
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Relu", {"x"}, {"a"});
  *graph.add_node() = testing::WithGraphAttribute(
      testing::WithGraphAttribute(MakeNode("If", {"cond"}, {"y"}), "then_branch", body), "else_branch", other);
  *graph.add_input() = FloatValue("x", {3});
  *graph.add_input() = testing::MakeValue("cond", onnx::TensorProto::BOOL, {});
  *graph.add_output() = FloatValue("y", {3});
  const onnx::ModelProto original = MakeModel(graph);
  PassRun run = RunPass("eliminate_dead_nodes", original);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(run.model.graph().node_size(), 2);
}

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

// Removing Identity leaves its only consumer's input unused: the fixed point of the basic preset
// chains the passes.
TEST(BasicPresetTest, ReachesAFixedPointAcrossPasses) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Mul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Identity", {"m"}, {"unused"});
  *graph.add_node() = MakeNode("Relu", {"x"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {2}, {1, 2});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_output() = FloatValue("y", {2});
  const onnx::ModelProto original = MakeModel(graph);
  onnx::ModelProto model = original;
  auto pipeline = BuildPipeline(v1::OptimizationConfig(), DefaultPassRegistry());
  ASSERT_TRUE(pipeline.ok());
  std::vector<v1::PassReport> reports;
  ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
  EXPECT_EQ(model.graph().node_size(), 1);
  EXPECT_EQ(model.graph().initializer_size(), 0);
  ExpectSameOutputs(original, model);
}

}  // namespace
}  // namespace onnxopt
