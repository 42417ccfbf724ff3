// upstream_slice: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_manager.h"
#include "optimizer/passes/constants.h"
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
using testing::RandomFloats;
using testing::RunConfig;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

// x[2,5,8] -> MatMul(W[8,8]) -> Add(b[8]) -> LayerNorm-like (ReduceMean, Sub, Div) -> Softmax -> Tanh
// -> Gather(axis 1, index 0) -> y[2,8]: every step is one the slice may climb.
onnx::ModelProto HeadModel(bool scalar_index) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Add", {"m", "b"}, {"a"});
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"a"}, {"mean"}), "axes", {-1});
  *graph.add_node() = MakeNode("Sub", {"a", "mean"}, {"centered"});
  *graph.add_node() = MakeNode("Div", {"centered", "two"}, {"scaled"});
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"scaled"}, {"p"}), "axis", -1);
  *graph.add_node() = MakeNode("Tanh", {"p"}, {"t"});
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"t", "index"}, {"y"}), "axis", 1);
  *graph.add_initializer() = FloatTensor("w", {8, 8}, RandomFloats(64, 11));
  *graph.add_initializer() = FloatTensor("b", {8}, RandomFloats(8, 12));
  *graph.add_initializer() = FloatTensor("two", {}, {2.0f});
  onnx::TensorProto index = MakeInt64Tensor("index", {3});
  if (scalar_index) index.clear_dims();
  *graph.add_initializer() = index;
  *graph.add_input() = FloatValue("x", {2, 5, 8});
  onnx::ValueInfoProto output = FloatValue("y", {});
  output.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = output;
  return MakeModel(graph, 13);
}

TEST(UpstreamSliceTest, ClimbsToTheInputSoEveryNodeComputesOneRow) {
  for (bool scalar : {true, false}) {
    const onnx::ModelProto original = HeadModel(scalar);
    PassRun run = RunConfig(R"({"passes": [{"name": "upstream_slice"}, {"name": "eliminate_common_subexpressions"},
                                      {"name": "upstream_slice"}]})", original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    // The only Gather left reads the graph input: everything after it runs on one row.
    int gathers_on_input = 0, gathers = 0;
    for (const auto& node : run.model.graph().node()) {
      if (node.op_type() != "Gather") continue;
      ++gathers;
      gathers_on_input += node.input(0) == "x";
    }
    EXPECT_EQ(gathers, 1) << run.model.graph().DebugString();
    EXPECT_EQ(gathers_on_input, 1);
    ExpectSameOutputs(original, run.model, 0, 0);
  }
}

TEST(UpstreamSliceTest, CrossesTransposes) {
  for (bool scalar : {true, false}) {
    onnx::GraphProto graph;
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"x"}, {"t"}), "perm", {2, 0, 1});  // [4,2,3]
    *graph.add_node() = MakeNode("Relu", {"t"}, {"r"});
    *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"r", "index"}, {"y"}), "axis", 1);
    onnx::TensorProto index = MakeInt64Tensor("index", {1});
    if (scalar) index.clear_dims();
    *graph.add_initializer() = index;
    *graph.add_input() = FloatValue("x", {2, 3, 4});
    onnx::ValueInfoProto output = FloatValue("y", {});
    output.mutable_type()->mutable_tensor_type()->clear_shape();
    *graph.add_output() = output;
    const onnx::ModelProto original = MakeModel(graph, 13);
    PassRun run = RunConfig(R"({"passes": [{"name": "upstream_slice"}]})", original);
    ASSERT_TRUE(run.status.ok());
    EXPECT_EQ(run.report.rewrites(), 2) << scalar;
    EXPECT_EQ(run.model.graph().node(0).op_type(), "Gather") << run.model.graph().DebugString();
    ExpectSameOutputs(original, run.model, 0, 0);
  }
}

TEST(UpstreamSliceTest, StaysWhereMovingWouldChangeTheResult) {
  // Softmax over the sliced axis, and an input broadcasting along it with size 1.
  onnx::GraphProto graph;
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"x"}, {"p"}), "axis", 1);
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"p", "index"}, {"y"}), "axis", 1);
  *graph.add_node() = MakeNode("Add", {"x", "ones"}, {"s"});
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"s", "index"}, {"z"}), "axis", 1);
  onnx::TensorProto index = MakeInt64Tensor("index", {0});
  index.clear_dims();
  *graph.add_initializer() = index;
  *graph.add_input() = FloatValue("x", {2, 5, 8});
  *graph.add_input() = FloatValue("ones", {2, 1, 8});
  *graph.add_output() = FloatValue("y", {2, 8});
  *graph.add_output() = FloatValue("z", {2, 8});
  PassRun run = RunConfig(R"({"passes": [{"name": "upstream_slice"}]})", MakeModel(graph, 13));
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 0);
}

// The exported RoBERTa-style classifier, dynamic batch and sequence as exported: symbolic shape
// recovery lets the token slice climb through the last layer.
TEST(UpstreamSliceTest, ShrinksTheDynamicRobertaHead) {
  auto original = LoadModel(testing::FixturePath("roberta_cls.onnx"));
  ASSERT_TRUE(original.ok());
  for (bool fixed_dims : {false, true}) {
    onnx::ModelProto start = *original;
    if (fixed_dims) {
      PassRun fixed = RunConfig(R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch=2,sequence=16"}}]})",
                            *original);
      ASSERT_TRUE(fixed.status.ok());
      start = fixed.model;
    }
    v1::OptimizationConfig config;
    config.set_preset(v1::Pipelines::extended);
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    onnx::ModelProto model = start;
    std::vector<v1::PassReport> reports;
    ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
    int64_t moves = 0;
    for (const auto& report : reports) {
      if (report.name() == "upstream_slice") moves += report.rewrites();
    }
    EXPECT_GE(moves, 10) << "fixed dims " << fixed_dims << ": the token slice climbs through the last layer";
    ExpectSameOutputs(start, model, 1e-5, 1e-4);
  }
}

// After the transformer fusions the last layer is SkipLayerNormalization, BiasGelu/Gelu and MatMuls:
// the classification head's token slice still climbs through its feed-forward block (both exporters).
TEST(UpstreamSliceTest, ClimbsThroughFusedOperatorsToTheLastAttention) {
  for (const char* name : {"hf/roberta_cls_torchscript.onnx", "hf/roberta_cls_dynamo.onnx"}) {
    auto original = LoadModel(testing::FixturePath(name));
    ASSERT_TRUE(original.ok()) << name;
    PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    // Every SkipLayerNormalization after the last Attention reads sliced tokens.
    const auto& nodes = run.model.graph().node();
    int last_attention = -1;
    for (int i = 0; i < nodes.size(); ++i) {
      if (nodes[i].op_type() == "Attention") last_attention = i;
    }
    ASSERT_GE(last_attention, 0) << name;
    int sliced_norms = 0;
    for (int i = last_attention + 1; i < nodes.size(); ++i) {
      if (nodes[i].op_type() != "SkipLayerNormalization") continue;
      ++sliced_norms;
      EXPECT_TRUE(absl::StrContains(nodes[i].input(1), "_sliced")) << name << ": " << nodes[i].name();
    }
    EXPECT_EQ(sliced_norms, 2) << name << ": after attention and after the feed-forward block";
    v1::ParityReport parity;
    testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {16, 128}, &parity);
  }
}

}  // namespace
}  // namespace onnxopt
