// fuse_attention: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/shape_info.h"
#include "tests/attention_graphs.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::OpCounts;
using testing::PassRun;
using testing::RunConfig;

// Runs `model` on token ids with the given attention mask; returns the first output.
std::vector<float> RunEncoder(const onnx::ModelProto& model, const std::vector<int64_t>& ids,
                              const std::vector<int64_t>& mask) {
  auto session = CreateSession({model.SerializeAsString(), {}}, {});
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const int64_t shape[] = {1, static_cast<int64_t>(ids.size())};
  std::vector<int64_t> ids_copy = ids, mask_copy = mask, types(ids.size(), 0);
  Ort::Value inputs[] = {Ort::Value::CreateTensor<int64_t>(memory, ids_copy.data(), ids_copy.size(), shape, 2),
                         Ort::Value::CreateTensor<int64_t>(memory, mask_copy.data(), mask_copy.size(), shape, 2),
                         Ort::Value::CreateTensor<int64_t>(memory, types.data(), types.size(), shape, 2)};
  const char* input_names[] = {"input_ids", "attention_mask", "token_type_ids"};
  const char* output_names[] = {"last_hidden_state"};
  auto outputs = (*session)->Run(Ort::RunOptions{nullptr}, input_names, inputs, 3, output_names, 1);
  const float* data = outputs[0].GetTensorData<float>();
  return std::vector<float>(data, data + outputs[0].GetTensorTypeAndShapeInfo().GetElementCount());
}

TEST(FuseAttentionTest, FusesEveryLayerAndKeepsMaskedOutputs) {
  auto original = LoadModel(testing::FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Attention"], 2) << "one per layer";
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_LT(run.model.graph().node_size(), 30);
  // Padding: the last 5 of 12 tokens are masked out, which generated inputs (all ones) never show.
  std::vector<int64_t> ids = {5, 17, 99, 3, 64, 12, 7, 1, 0, 0, 0, 0};
  std::vector<int64_t> mask = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
  const std::vector<float> expected = RunEncoder(*original, ids, mask);
  const std::vector<float> actual = RunEncoder(run.model, ids, mask);
  ASSERT_EQ(expected.size(), actual.size());
  double max_error = 0;
  for (size_t i = 0; i < expected.size(); ++i) max_error = std::max<double>(max_error, std::fabs(expected[i] - actual[i]));
  EXPECT_LT(max_error, 1e-4);
}

TEST(FuseAttentionTest, FusesGpt2CausalAttentionAndChecksTheBuffer) {
  auto original = LoadModel(testing::FixturePath("gpt2_tiny.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  int causal = 0;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "Attention") continue;
    for (const auto& attribute : node.attribute()) causal += attribute.name() == "unidirectional" && attribute.i() == 1;
  }
  EXPECT_EQ(causal, 2) << "one causal Attention per layer";
  EXPECT_EQ(OpCounts(run.model).count("Softmax"), 0u);
  ExpectSameOutputs(*original, run.model, 1e-5, 1e-4);

  // One entry above the diagonal: no longer causal, so no fusion.
  onnx::ModelProto tampered = *original;
  for (auto& tensor : *tampered.mutable_graph()->mutable_initializer()) {
    if (tensor.name() != "bias") continue;
    ASSERT_TRUE(tensor.has_raw_data());
    (*tensor.mutable_raw_data())[1] = 1;  // row 0, column 1
  }
  PassRun refused = RunConfig(R"({"preset": "transformer"})", tampered);
  ASSERT_TRUE(refused.status.ok());
  EXPECT_EQ(OpCounts(refused.model).count("Attention"), 0u);
  ExpectSameOutputs(tampered, refused.model, 1e-5, 1e-4);
}

// The hand-built block (tests/attention_graphs.h) fuses into Attention and keeps its outputs.
TEST(FuseAttentionTest, AHandBuiltBlockFusesExactly) {
  const onnx::ModelProto original = testing::AttentionGraph({});
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_attention"}]})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Attention", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

// A pruned model's V heads narrower than Q's and K's (ONNX Runtime's own test of varied Q/K/V sizes): one
// Attention with qkv_hidden_sizes, its V part of the packed weight its own width; exact.
TEST(FuseAttentionTest, VHeadsOfAnotherWidthBecomeQkvHiddenSizes) {
  testing::AttentionGraphOptions options;
  options.v_head_size = 4;
  const onnx::ModelProto original = testing::AttentionGraph(options);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_attention"}]})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Attention", 1}}));
  for (const auto& node : run.model.graph().node()) {
    const onnx::AttributeProto* sizes = FindAttribute(node, "qkv_hidden_sizes");
    ASSERT_NE(sizes, nullptr);
    EXPECT_EQ(std::vector<int64_t>(sizes->ints().begin(), sizes->ints().end()), (std::vector<int64_t>{16, 16, 8}));
  }
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

// A K "projection" by a rank-0 weight is no projection matrix: the block stays, with the reason. The
// check once read the weight's last dim before its rank (dims(-1) of a rank-0 tensor).
TEST(FuseAttentionTest, AScalarWeightIsRefusedWithItsReason) {
  testing::AttentionGraphOptions options;
  options.scalar_k_weight = true;
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_attention"}]})", testing::AttentionGraph(options));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::SkipCount(run.report, "projection weights are not float constants of one width"), 1)
      << run.report.DebugString();
}

// Rotated Q and K with a causal buffer (Where over a sliced triangle, GPT-2's spelling) beside key
// padding: the buffer is the operator's causal mask, the padding probed beside it; exact.
TEST(FuseAttentionTest, ACausalBufferBesideRotationsIsTheOperatorsCausalMask) {
  testing::AttentionGraphOptions options;
  options.rotary = true;
  options.padding_mask = true;
  options.causal_buffer = true;
  options.grouped = true;
  const onnx::ModelProto original = testing::AttentionGraph(options);
  for (const char* grouped : {"multi_head", "group_query"}) {
    PassRun run = RunConfig(absl::StrCat(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "fuse_attention",
                                         "params": {"grouped_query": ")", grouped, R"("}}]})"),
                            original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.report.rewrites(), 1) << grouped << run.report.DebugString();
    EXPECT_EQ(run.report.counters().at("mask_probes"), 1);
    EXPECT_EQ(OpCounts(run.model).count("Softmax"), 0u);
    ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  }
}

// A rotation in a form no matcher knows (rotate_half negating by Mul(x, -1)) stays as the graph has it,
// and the attention core still fuses over the rotated heads it computes; the report says why.
TEST(FuseAttentionTest, AnUnknownRotationStaysAndTheCoreFusesOverTheHeadsItComputes) {
  testing::AttentionGraphOptions options;
  options.rotary = true;
  options.padding_mask = true;
  options.causal_mask = true;
  options.negate_by_mul = true;
  for (bool grouped : {false, true}) {
    options.grouped = grouped;
    const onnx::ModelProto original = testing::AttentionGraph(options);
    PassRun run = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "fuse_attention"}]})", original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    auto ops = OpCounts(run.model);
    EXPECT_EQ(ops.count("RotaryEmbedding"), 0u);
    EXPECT_EQ(ops.count("Softmax"), 0u);
    EXPECT_EQ(ops[grouped ? "GroupQueryAttention" : "MultiHeadAttention"], 1) << run.report.DebugString();
    EXPECT_EQ(run.report.counters().at("fused_over_given_heads"), 1);
    ASSERT_EQ(run.report.notes_size(), 1);
    EXPECT_NE(run.report.notes(0).find("attention fused over the heads as the graph computes them"),
              std::string::npos) << run.report.notes(0);
    ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  }
}

// Grouped-query attention (one key/value head for two query heads, rotated, causal): MultiHeadAttention
// with K and V repeated, or GroupQueryAttention with them at their own head when the pass is asked for
// it; both exact, with key padding beside the causal mask too (as GroupQueryAttention's attention_bias).
TEST(FuseAttentionTest, GroupedQueryAttentionAsEitherOperator) {
  testing::AttentionGraphOptions options;
  options.rotary = true;
  options.grouped = true;
  options.causal_mask = true;
  const onnx::ModelProto original = testing::AttentionGraph(options);
  for (const char* grouped : {"multi_head", "group_query"}) {
    PassRun run = RunConfig(absl::StrCat(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "fuse_attention",
                                             "params": {"grouped_query": ")", grouped, R"("}}, {"name": "eliminate_dead_nodes"}]})"),
                            original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    std::map<std::string, int> ops = OpCounts(run.model);
    const bool gqa = std::string(grouped) == "group_query";
    EXPECT_EQ(ops["GroupQueryAttention"], gqa ? 1 : 0) << grouped;
    EXPECT_EQ(ops["MultiHeadAttention"], gqa ? 0 : 1) << grouped;
    for (const auto& node : run.model.graph().node()) {
      if (node.op_type() != "GroupQueryAttention") continue;
      const onnx::NodeProto* key = nullptr;
      for (const auto& producer : run.model.graph().node()) {
        if (producer.output_size() > 0 && producer.output(0) == node.input(1)) key = &producer;
      }
      ASSERT_NE(key, nullptr);
      EXPECT_EQ(key->op_type(), "RotaryEmbedding") << "K goes in at its own head, not repeated";
    }
    EXPECT_EQ(ops.count("Softmax"), 0u) << grouped;
    ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  }
  // Causal with key padding: the padding goes in as attention_bias, the same outputs.
  options.padding_mask = true;
  const onnx::ModelProto padded_original = testing::AttentionGraph(options);
  PassRun padded = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "fuse_attention",
                                 "params": {"grouped_query": "group_query"}}]})",
                             padded_original);
  ASSERT_TRUE(padded.status.ok()) << padded.status;
  EXPECT_EQ(OpCounts(padded.model)["GroupQueryAttention"], 1);
  for (const auto& node : padded.model.graph().node()) {
    if (node.op_type() == "GroupQueryAttention") EXPECT_TRUE(node.input_size() > 10 && !node.input(10).empty());
  }
  ExpectSameOutputs(padded_original, padded.model, 1e-5, 1e-5);
  // Padding without the causal mask lets a query see later keys: the causal kernel does not fit.
  options.causal_mask = false;
  PassRun bidirectional = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "fuse_attention",
                                        "params": {"grouped_query": "group_query"}}]})",
                                    testing::AttentionGraph(options));
  ASSERT_TRUE(bidirectional.status.ok()) << bidirectional.status;
  EXPECT_EQ(OpCounts(bidirectional.model)["GroupQueryAttention"], 0);
  EXPECT_EQ(OpCounts(bidirectional.model)["MultiHeadAttention"], 1);
  EXPECT_EQ(RunConfig(R"({"passes": [{"name": "fuse_attention", "params": {"grouped_query": "gqa"}}]})", original)
                .status.code(),
            absl::StatusCode::kInvalidArgument);
}

// Grouped-query attention with nothing rotating Q and K outside the kernel (here no rotary at all: K and V
// repeated to the query heads straight after their head split) takes them packed with V as one query:
// one MatMul over [Wq|Wk|Wv] and one Add of the biases instead of three of each; exact, padded too.
TEST(FuseAttentionTest, GroupQueryAttentionReadsQKeyAndValuePackedIntoOneProjection) {
  testing::AttentionGraphOptions options;
  options.grouped = true;
  options.causal_mask = true;
  options.padding_mask = true;
  const onnx::ModelProto original = testing::AttentionGraph(options);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_attention", "params": {"grouped_query": "group_query"}},
                                         {"name": "eliminate_dead_nodes"}]})",
                          original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = OpCounts(run.model);
  ASSERT_EQ(ops["GroupQueryAttention"], 1) << run.report.DebugString();
  EXPECT_EQ(ops["MatMul"], 1) << "one packed projection for the three";
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "GroupQueryAttention") continue;
    EXPECT_TRUE(node.input(1).empty() && node.input(2).empty());
    const onnx::NodeProto* bias = nullptr;
    for (const auto& producer : run.model.graph().node()) {
      if (producer.output(0) == node.input(0)) bias = &producer;
    }
    ASSERT_NE(bias, nullptr);
    EXPECT_EQ(bias->op_type(), "Add") << "the three biases as one";
  }
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

// A sliding window the graph's positions reach (each query sees itself and one key before): the probe
// tells its width, and GroupQueryAttention applies it itself (local_window_size = W) with only the
// key padding as attention_bias; exact, padded. MultiHeadAttention takes the whole mask as its bias.
TEST(FuseAttentionTest, ASlidingWindowBecomesGroupQueryAttentionsLocalWindow) {
  testing::AttentionGraphOptions options;
  options.rotary = true;
  options.grouped = true;
  options.causal_mask = true;
  options.padding_mask = true;
  options.window = 2;
  const onnx::ModelProto original = testing::AttentionGraph(options);
  for (const char* grouped : {"group_query", "multi_head"}) {
    PassRun run = RunConfig(absl::StrCat(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "fuse_attention",
                                             "params": {"grouped_query": ")", grouped, R"("}}, {"name": "eliminate_dead_nodes"}]})"),
                            original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    std::map<std::string, int> ops = OpCounts(run.model);
    EXPECT_EQ(ops.count("Softmax"), 0u) << grouped;
    const bool gqa = std::string(grouped) == "group_query";
    EXPECT_EQ(ops["GroupQueryAttention"], gqa ? 1 : 0) << grouped;
    for (const auto& node : run.model.graph().node()) {
      if (node.op_type() != "GroupQueryAttention") continue;
      int64_t local_window = -1;
      for (const auto& attribute : node.attribute()) {
        if (attribute.name() == "local_window_size") local_window = attribute.i();
      }
      EXPECT_EQ(local_window, 2) << "the query's last two keys, itself included";
      EXPECT_EQ(ops.count("Greater"), 0u) << "the window's comparison went with the condition";
    }
    ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  }
}

// Mistral's sliding window (4096) is wider than the mask probe can check, so the mask's meaning stays
// unknown; but it is an And with a conjunct the probe shows causal, so no query ever sees a later key:
// GroupQueryAttention takes the whole mask as its attention_bias, exactly.
TEST(FuseAttentionTest, AWindowWiderThanTheProbeBesideACausalConjunctStillFitsGroupQueryAttention) {
  testing::AttentionGraphOptions options;
  options.rotary = true;
  options.grouped = true;
  options.causal_mask = true;
  options.padding_mask = true;
  options.wide_window = true;
  const onnx::ModelProto original = testing::AttentionGraph(options);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "fuse_attention",
                              "params": {"grouped_query": "group_query"}}]})",
                          original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model)["GroupQueryAttention"], 1);
  EXPECT_EQ(OpCounts(run.model).count("Softmax"), 0u);
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

// Q, K^T and V handed in as heads (DiT's attention processor: Q [B,N,S,D], K already transposed to
// [B,N,D,S], V [B,N,S,D]): MultiHeadAttention over them, K transposed back for its BNSH key; exact.
TEST(FuseAttentionTest, QueriesAndPreTransposedKeysGivenAsHeadsBecomeMultiHeadAttention) {
  onnx::GraphProto graph;
  *graph.add_input() = testing::FloatValue("q", {2, 4, 5, 8});
  *graph.add_input() = testing::FloatValue("k_t", {2, 4, 8, 5});
  *graph.add_input() = testing::FloatValue("v", {2, 4, 5, 8});
  *graph.add_initializer() = MakeFloatTensor("scale", {}, {0.35f});
  *graph.add_initializer() = MakeInt64Tensor("merged", {2, 5, 32});
  *graph.add_node() = testing::MakeNode("MatMul", {"q", "k_t"}, {"scores"});
  *graph.add_node() = testing::MakeNode("Mul", {"scores", "scale"}, {"scaled"});
  *graph.add_node() = testing::WithIntAttribute(testing::MakeNode("Softmax", {"scaled"}, {"probs"}), "axis", -1);
  *graph.add_node() = testing::MakeNode("MatMul", {"probs", "v"}, {"context"});
  *graph.add_node() =
      testing::WithIntsAttribute(testing::MakeNode("Transpose", {"context"}, {"context_bsnd"}), "perm", {0, 2, 1, 3});
  *graph.add_node() = testing::MakeNode("Reshape", {"context_bsnd", "merged"}, {"y"});
  *graph.add_output() = testing::FloatValue("y", {2, 5, 32});
  const onnx::ModelProto original = testing::MakeModel(graph, 17);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_attention"}]})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model)["MultiHeadAttention"], 1);
  EXPECT_EQ(OpCounts(run.model).count("Softmax"), 0u);
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace
}  // namespace onnxopt
