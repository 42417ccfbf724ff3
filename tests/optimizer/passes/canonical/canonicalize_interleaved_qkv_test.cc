// canonicalize_interleaved_qkv: a projection packing Q, K and V per head (Megatron's view [B,S,N,3D] and
// split) becomes the [Q | K | V] packed form with the same values in ONNX Runtime; a projection read
// elsewhere stays.
#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

constexpr int64_t kHeads = 4, kHeadSize = 8, kIn = 32;

// h [2, 5, kIn] -> MatMul(W [kIn, 3ND]) + b -> Reshape [0, 0, N, 3D] -> Split(-1, [D, D, D]) -> q, k, v;
// `leak`: the projection is a graph output too.
onnx::ModelProto InterleavedModel(bool leak) {
  onnx::GraphProto graph;
  const int64_t width = 3 * kHeads * kHeadSize;
  *graph.add_input() = testing::FloatValue("h", {2, 5, kIn});
  *graph.add_initializer() = testing::FloatTensor("w", {kIn, width}, testing::RandomFloats(kIn * width, 3));
  *graph.add_initializer() = testing::FloatTensor("b", {width}, testing::RandomFloats(width, 4));
  *graph.add_initializer() = MakeInt64Tensor("target", {0, 0, kHeads, 3 * kHeadSize});
  *graph.add_initializer() = MakeInt64Tensor("sizes", {kHeadSize, kHeadSize, kHeadSize});
  *graph.add_node() = testing::MakeNode("MatMul", {"h", "w"}, {"projected"});
  *graph.add_node() = testing::MakeNode("Add", {"projected", "b"}, {"x"});
  *graph.add_node() = testing::MakeNode("Reshape", {"x", "target"}, {"y"});
  *graph.add_node() = testing::WithIntAttribute(testing::MakeNode("Split", {"y", "sizes"}, {"q", "k", "v"}), "axis", -1);
  for (const char* part : {"q", "k", "v"}) *graph.add_output() = testing::FloatValue(part, {2, 5, kHeads, kHeadSize});
  if (leak) *graph.add_output() = testing::FloatValue("x", {2, 5, width});
  return testing::MakeModel(graph, 17);
}

TEST(CanonicalizeInterleavedQkvTest, PerHeadPackingBecomesPartsFirst) {
  const onnx::ModelProto original = InterleavedModel(false);
  testing::PassRun run = testing::RunPass("canonicalize_interleaved_qkv", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["Reshape"], 3) << "a head Reshape per part";
  EXPECT_EQ(ops["Split"], 1);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "MatMul") EXPECT_NE(node.input(1), "w") << "the columns are reordered";
  }
  testing::ExpectSameOutputs(original, run.model, 0, 0);
}

TEST(CanonicalizeInterleavedQkvTest, AProjectionReadElsewhereStays) {
  testing::PassRun run = testing::RunPass("canonicalize_interleaved_qkv", InterleavedModel(true));
  EXPECT_EQ(run.report.rewrites(), 0);
}

}  // namespace
}  // namespace onnxopt
