// fuse_layer_norm: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <map>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
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
using testing::WithIntsAttribute;

// x[2,4,8] -> decomposed LayerNorm (as torch exports it) -> y
onnx::ModelProto DecomposedLayerNorm(float exponent, bool leak) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"x"}, {"mean"}), "axes", {-1});
  *graph.add_node() = MakeNode("Sub", {"x", "mean"}, {"d"});
  *graph.add_node() = MakeNode("Pow", {"d", "two"}, {"sq"});
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"sq"}, {"var"}), "axes", {-1});
  *graph.add_node() = MakeNode("Add", {"var", "eps"}, {"ve"});
  *graph.add_node() = MakeNode("Sqrt", {"ve"}, {"std"});
  *graph.add_node() = MakeNode("Div", {"d", "std"}, {"n"});
  *graph.add_node() = MakeNode("Mul", {"n", "gamma"}, {"scaled"});
  *graph.add_node() = MakeNode("Add", {"scaled", "beta"}, {"y"});
  *graph.add_initializer() = FloatTensor("two", {}, {exponent});
  *graph.add_initializer() = FloatTensor("eps", {}, {1e-5f});
  *graph.add_initializer() = FloatTensor("gamma", {8}, RandomFloats(8, 31));
  *graph.add_initializer() = FloatTensor("beta", {8}, RandomFloats(8, 32));
  *graph.add_input() = FloatValue("x", {2, 4, 8});
  *graph.add_output() = FloatValue("y", {2, 4, 8});
  if (leak) *graph.add_output() = FloatValue("std", {2, 4, 1});
  return MakeModel(graph, 17);
}

TEST(FuseLayerNormTest, FusesTheExportedFormExactly) {
  const onnx::ModelProto original = DecomposedLayerNorm(2.0f, false);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"LayerNormalization", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
}

// The fused kernels take scale and bias of the normalized width only: a broadcasting bias [1]
// stays an Add, and the result still loads and matches.
TEST(FuseLayerNormTest, KeepsABroadcastingBiasOutside) {
  onnx::ModelProto original = DecomposedLayerNorm(2.0f, false);
  for (auto& tensor : *original.mutable_graph()->mutable_initializer()) {
    if (tensor.name() == "beta") tensor = FloatTensor("beta", {1}, {0.25f});
  }
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Add", 1}, {"LayerNormalization", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
}

TEST(FuseLayerNormTest, LeavesLookalikesAlone) {
  EXPECT_EQ(RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", DecomposedLayerNorm(3.0f, false)).report.rewrites(), 0)
      << "a cube is no variance";
  PassRun leak = RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", DecomposedLayerNorm(2.0f, true));
  EXPECT_EQ(leak.report.rewrites(), 0) << "the standard deviation is an output";
}

// TensorFlow's batch_normalization spelling, as tf2onnx and keras2onnx write a LayerNorm:
// inv = Reciprocal(Sqrt(mean((x - m)^2) + eps)) * gamma;  y = x * inv + (beta - m * inv).
TEST(FuseLayerNormTest, FusesTensorflowsBatchNormalizationSpelling) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 4, 16});
  *graph.add_output() = FloatValue("y", {2, 4, 16});
  *graph.add_initializer() = FloatTensor("eps", {}, {1e-12f});
  *graph.add_initializer() = FloatTensor("gamma", {16}, RandomFloats(16, 1));
  *graph.add_initializer() = FloatTensor("beta", {16}, RandomFloats(16, 2));
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"x"}, {"mean"}), "axes", {2});
  *graph.add_node() = MakeNode("Sub", {"x", "mean"}, {"d"});
  *graph.add_node() = MakeNode("Mul", {"d", "d"}, {"squared"});
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"squared"}, {"variance"}), "axes", {2});
  *graph.add_node() = MakeNode("Add", {"variance", "eps"}, {"shifted"});
  *graph.add_node() = MakeNode("Sqrt", {"shifted"}, {"root"});
  *graph.add_node() = MakeNode("Reciprocal", {"root"}, {"inverse"});
  *graph.add_node() = MakeNode("Mul", {"inverse", "gamma"}, {"inv"});
  *graph.add_node() = MakeNode("Mul", {"x", "inv"}, {"scaled"});
  *graph.add_node() = MakeNode("Mul", {"mean", "inv"}, {"scaled_mean"});
  *graph.add_node() = MakeNode("Sub", {"beta", "scaled_mean"}, {"offset"});
  *graph.add_node() = MakeNode("Add", {"scaled", "offset"}, {"y"});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"LayerNormalization", 1}}));
  for (const auto& node : run.model.graph().node()) {
    ASSERT_EQ(node.input_size(), 3);
    EXPECT_EQ(node.input(1), "gamma");
    EXPECT_EQ(node.input(2), "beta");
  }
  ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
}

TEST(FuseLayerNormTest, FusesEveryLayerNormOfTheExportedEncoder) {
  auto original = LoadModel(testing::FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  // The 4 LayerNorms after a residual Add become SkipLayerNormalization, the embeddings' one
  // EmbedLayerNormalization.
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["SkipLayerNormalization"], 4);
  EXPECT_EQ(ops["EmbedLayerNormalization"], 1);
  EXPECT_EQ(ops.count("LayerNormalization"), 0u);
  EXPECT_EQ(ops["BiasGelu"], 2);
  EXPECT_EQ(ops.count("ReduceMean"), 0u);
  ExpectSameOutputs(*original, run.model, 1e-5, 1e-3);
}

}  // namespace
}  // namespace onnxopt
