// fuse_attention on the projection forms of 2026's models, built by hand at sizes no fixture has (2 heads
// of 8): a partial rotation (Phi), an unmerged LoRA branch on Q and V (peft), an RMSNorm of each head
// of Q and K before the rotation (Qwen3, Gemma 3) or of the whole projections (OLMo 2). Each fuses into MultiHeadAttention and ONNX Runtime
// gives the same outputs.
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "tests/attention_graphs.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::AttentionGraph;
using testing::AttentionGraphOptions;
using testing::ExpectSameOutputs;
using testing::OpCounts;
using testing::PassRun;
using testing::RunConfig;

// The transformer preset on a hand-built block.
PassRun Transform(const onnx::ModelProto& model) {
  PassRun run = RunConfig(R"({"preset": "transformer"})", model);
  EXPECT_TRUE(run.status.ok()) << run.status;
  return run;
}

int64_t IntAttribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.name() == name) return attribute.i();
  }
  return 0;
}

// Phi rotates the first r of each head: RotaryEmbedding's rotary_embedding_dim, the rest copied.
TEST(FuseAttentionProjectionFormsTest, PartialRotationBecomesRotaryEmbeddingDim) {
  AttentionGraphOptions options;
  options.rotary = true;
  options.rotary_dim = 4;
  options.padding_mask = true;
  const onnx::ModelProto original = AttentionGraph(options);
  PassRun run = Transform(original);
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops["MultiHeadAttention"], 1);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  int rotations = 0;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "RotaryEmbedding") continue;
    ++rotations;
    EXPECT_EQ(IntAttribute(node, "rotary_embedding_dim"), 4) << node.name();
    EXPECT_EQ(IntAttribute(node, "num_heads"), 2) << node.name();
  }
  EXPECT_EQ(rotations, 2) << "Q and K";
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  // The whole head (r = D) written the same way needs no attribute.
  options.rotary_dim = testing::kAttentionHeadSize;
  const onnx::ModelProto whole = AttentionGraph(options);
  PassRun whole_run = Transform(whole);
  EXPECT_EQ(OpCounts(whole_run.model)["MultiHeadAttention"], 1);
  for (const auto& node : whole_run.model.graph().node()) {
    if (node.op_type() == "RotaryEmbedding") EXPECT_EQ(IntAttribute(node, "rotary_embedding_dim"), 0);
  }
  ExpectSameOutputs(whole, whole_run.model, 1e-5, 1e-5);
}

// A LoRA branch x W + b + s (x A) B is still a projection: the block fuses around it and the branch's
// MatMuls stay (Attention would need the adapter merged into its packed weights).
TEST(FuseAttentionProjectionFormsTest, LoraBranchesStayOutsideMultiHeadAttention) {
  AttentionGraphOptions options;
  options.lora = true;
  options.padding_mask = true;
  const onnx::ModelProto original = AttentionGraph(options);
  PassRun run = Transform(original);
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops["MultiHeadAttention"], 1);
  EXPECT_EQ(ops.count("Attention"), 0u);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_EQ(ops["MatMul"], 3 + 2 * 2) << "Q, K, V and the A and B of the two adapted projections";
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  // Without the branch the same block still goes into Attention with its packed weights.
  options.lora = false;
  PassRun plain = Transform(AttentionGraph(options));
  EXPECT_EQ(OpCounts(plain.model)["Attention"], 1);
}

// Qwen3 and Gemma 3 normalize each head of Q and K (RMSNorm over D) between the head split and the
// transpose, before the rotation: the norm stays on the heads, MultiHeadAttention reads it merged back.
TEST(FuseAttentionProjectionFormsTest, PerHeadNormBeforeTheRotationFuses) {
  for (bool grouped : {false, true}) {
    AttentionGraphOptions options;
    options.rotary = true;
    options.head_norm = true;
    options.grouped = grouped;
    options.padding_mask = true;
    options.causal_mask = true;
    const onnx::ModelProto original = AttentionGraph(options);
    PassRun run = Transform(original);
    std::map<std::string, int> ops = OpCounts(run.model);
    EXPECT_EQ(ops[grouped ? "GroupQueryAttention" : "MultiHeadAttention"], 1) << "grouped " << grouped;
    EXPECT_EQ(ops["SimplifiedLayerNormalization"], 2) << "the head norms of Q and K";
    EXPECT_EQ(ops.count("Softmax"), 0u);
    ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  }
}

// OLMo 2 normalizes the whole Q and K projections before the head split: the norms stay as they are.
TEST(FuseAttentionProjectionFormsTest, ProjectionNormBeforeTheHeadSplitFuses) {
  AttentionGraphOptions options;
  options.rotary = true;
  options.projection_norm = true;
  options.padding_mask = true;
  const onnx::ModelProto original = AttentionGraph(options);
  PassRun run = Transform(original);
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops["MultiHeadAttention"], 1);
  EXPECT_EQ(ops["SimplifiedLayerNormalization"], 2) << "the norms of Q and K";
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace
}  // namespace onnxopt
