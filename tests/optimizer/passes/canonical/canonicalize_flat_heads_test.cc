// canonicalize_flat_heads: attention computed on heads flattened into the batch ([B*N, S, D] and bmm, older
// transformers' BART/Marian/Whisper) is computed on the 4-D heads, equal in ONNX Runtime, and then fuses;
// a Reshape that does not split the flattened batch back into the same heads keeps the 3-D chain.
#include <string>

#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {
namespace flat_heads_test {  // unity builds share the anonymous namespace

using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeNode;
using testing::OpCounts;
using testing::RandomFloats;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

constexpr int64_t kBatch = 3, kSeq = 4, kHeads = 2, kHeadSize = 8, kHidden = kHeads * kHeadSize;

// x [3, 4, 16]: Q (scaled), K and V projected, split into heads, flattened to [B*N, S, D]; scores with
// bmm, a [B, 1, S, S] float bias added on the scores viewed as [B, N, S, S] and viewed back; Softmax
// on axis 2; the context unflattened to [B, N, S, D] by `context_shape`, merged back to [B, S, H].
onnx::ModelProto FlatHeadsAttention(const std::vector<int64_t>& context_shape) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {kBatch, kSeq, kHidden});
  *graph.add_input() = FloatValue("mask", {kBatch, 1, kSeq, kSeq});
  *graph.add_initializer() = MakeInt64Tensor("heads", {kBatch, kSeq, kHeads, kHeadSize});
  *graph.add_initializer() = MakeInt64Tensor("flat", {kBatch * kHeads, -1, kHeadSize});
  *graph.add_initializer() = MakeInt64Tensor("scores_4d", {kBatch, kHeads, kSeq, kSeq});
  *graph.add_initializer() = MakeInt64Tensor("scores_3d", {kBatch * kHeads, kSeq, kSeq});
  *graph.add_initializer() = MakeInt64Tensor("context_4d", context_shape);
  *graph.add_initializer() = MakeInt64Tensor("merged", {kBatch, kSeq, kHidden});
  *graph.add_initializer() = FloatTensor("scale", {}, {0.35355339f});
  uint32_t seed = 1;
  for (const std::string p : {"q", "k", "v"}) {
    *graph.add_initializer() = FloatTensor("W" + p, {kHidden, kHidden}, RandomFloats(kHidden * kHidden, seed++));
    *graph.add_initializer() = FloatTensor("b" + p, {kHidden}, RandomFloats(kHidden, seed++));
    *graph.add_node() = MakeNode("MatMul", {"x", "W" + p}, {p + "_xw"});
    *graph.add_node() = MakeNode("Add", {p + "_xw", "b" + p}, {p + "_proj"});
    std::string projected = p + "_proj";
    if (p == "q") {
      *graph.add_node() = MakeNode("Mul", {projected, "scale"}, {"q_scaled"});
      projected = "q_scaled";
    }
    *graph.add_node() = MakeNode("Reshape", {projected, "heads"}, {p + "_4d"});
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {p + "_4d"}, {p + "_bnsd"}), "perm", {0, 2, 1, 3});
    *graph.add_node() = MakeNode("Reshape", {p + "_bnsd", "flat"}, {p + "_3d"});
  }
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"k_3d"}, {"k_t"}), "perm", {0, 2, 1});
  *graph.add_node() = MakeNode("MatMul", {"q_3d", "k_t"}, {"scores"});
  *graph.add_node() = MakeNode("Reshape", {"scores", "scores_4d"}, {"scores_heads"});
  *graph.add_node() = MakeNode("Add", {"scores_heads", "mask"}, {"masked_heads"});
  *graph.add_node() = MakeNode("Reshape", {"masked_heads", "scores_3d"}, {"masked"});
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"masked"}, {"probs"}), "axis", 2);
  *graph.add_node() = MakeNode("MatMul", {"probs", "v_3d"}, {"context"});
  *graph.add_node() = MakeNode("Reshape", {"context", "context_4d"}, {"context_heads"});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"context_heads"}, {"context_t"}), "perm", {0, 2, 1, 3});
  *graph.add_node() = MakeNode("Reshape", {"context_t", "merged"}, {"y"});
  *graph.add_output() = FloatValue("y", {kBatch, kSeq, kHidden});
  return testing::MakeModel(graph, 17);
}

TEST(CanonicalizeFlatHeadsTest, TheProductsRunOnTheHeadsAndThenFuse) {
  const onnx::ModelProto original = FlatHeadsAttention({kBatch, kHeads, kSeq, kHeadSize});
  testing::PassRun run = testing::RunPass("canonicalize_flat_heads", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 2) << "the mask's view of the scores and the context's";
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Reshape"], 4) << "the three head splits and the merge; no 3-D view is left";
  EXPECT_EQ(ops["Transpose"], 5) << "the head transposes, K's swap of its last two axes and the context's";
  testing::ExpectSameOutputs(original, run.model, 1e-5, 1e-5);

  testing::PassRun fused = testing::RunConfig(R"({"preset": "transformer"})", original);
  ASSERT_TRUE(fused.status.ok()) << fused.status;
  std::string passes;
  for (const v1::PassReport& pass : fused.reports) {
    if (pass.rewrites() > 0 || pass.skipped_size() > 0) passes += pass.DebugString();
  }
  EXPECT_EQ(OpCounts(fused.model)["MultiHeadAttention"] + OpCounts(fused.model)["Attention"], 1) << passes;
  testing::ExpectSameOutputs(original, fused.model, 1e-5, 1e-4);
}

// The context viewed as [N, B, S, D] is another grouping of the flattened batch: the 3-D chain stays
// (the scores' views still go to the heads, and the result is the same).
TEST(CanonicalizeFlatHeadsTest, AnotherSplitOfTheFlattenedBatchKeepsItsChain) {
  const onnx::ModelProto original = FlatHeadsAttention({kHeads, kBatch, kSeq, kHeadSize});
  testing::PassRun run = testing::RunPass("canonicalize_flat_heads", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1) << "only the scores' view";
  EXPECT_EQ(OpCounts(run.model)["Softmax"], 1);
  testing::ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace flat_heads_test
}  // namespace
}  // namespace onnxopt
