// com.microsoft::GroupQueryAttention from a matched grouped-query block (attention_emit.h):
//   y = GroupQueryAttention(rope'(x Wq), rope'(x Wk), x Wv, , , seqlens_k, total_sequence_length,
//                           num_heads=N, kv_num_heads=Nkv, scale)
// K and V stay at their Nkv heads (no repeat_kv: the kernel reads each key/value head for its group of
// N / Nkv query heads); rope' as for MultiHeadAttention. The kernel is causal and takes each row as
// seqlens_k[b] + 1 valid tokens from the start (right padding), so it is exact only where the
// original's mask is causal alone, no padding input: seqlens_k = S - 1 for every row,
// total_sequence_length = S. A causal mask with key padding keeps MultiHeadAttention, as does a head
// size the CPU kernel does not take (a multiple of 8).
// Which of the two runs faster is measured per model family (fuse_attention's grouped_query).
#include "optimizer/passes/fusion/attention_emit.h"

namespace onnxopt::attention {

bool GroupQueryAttentionFits(const AttentionMatch& match) {
  const MaskPlan& mask = match.mask;
  // ONNX Runtime's CPU kernel takes head sizes of multiples of 8 only.
  return match.k_repeat.has_value() && match.head_size % 8 == 0 && mask.causal && mask.raw_mask.empty() &&
         mask.bias.empty() && mask.bias_condition.empty();
}

void EmitGroupQueryAttention(Graph& graph, const AttentionMatch& match, const Replacement& plan,
                             PassContext& context) {
  NodeChain chain(graph, RemovePattern(graph, match, plan.pattern, plan.shape_nodes));
  auto [query, key] = RotatedQueryAndKey(graph, match, &chain);
  const std::string value = ProjectedValue(graph, match.v, &chain);
  // B and S of the query [B,S,H]: seqlens_k = S - 1 per row (int32 [B]), total_sequence_length = S.
  auto scalar = [&](const std::string& hint, int64_t v) {
    return graph.AddInitializer(MakeIntScalar(graph.UniqueName(hint), onnx::TensorProto::INT64, v))->name();
  };
  const std::string shape = chain.Add("Shape", {query}, "gqa_query_shape");
  const std::string batch = chain.Add("Gather", {shape, scalar("gqa_batch_index", 0)}, "gqa_batch",
                                      {MakeIntAttribute("axis", 0)});
  const std::string length = chain.Add("Gather", {shape, scalar("gqa_length_index", 1)}, "gqa_length",
                                       {MakeIntAttribute("axis", 0)});
  const std::string total = chain.Add("Cast", {length}, "gqa_total_sequence_length",
                                      {MakeIntAttribute("to", onnx::TensorProto::INT32)});
  const std::string last = chain.Add("Sub", {length, scalar("gqa_one", 1)}, "gqa_last_position");
  const std::string rows = chain.Add("Unsqueeze", {batch, graph.AddInitializer(MakeInt64Tensor(
                                                              graph.UniqueName("gqa_axes"), {0}))->name()},
                                     "gqa_rows");
  const std::string seqlens = chain.Add(
      "Cast", {chain.Add("Expand", {last, rows}, "gqa_seqlens_int64")}, "gqa_seqlens_k",
      {MakeIntAttribute("to", onnx::TensorProto::INT32)});
  const std::string attended =
      match.out.flattened ? graph.UniqueName(match.out.output + "_attention") : match.out.output;
  onnx::NodeProto gqa =
      MakeNode("GroupQueryAttention", graph.UniqueName("GroupQueryAttention"),
               {query, key, value, "", "", seqlens, total},
               {attended, graph.UniqueName("gqa_present_key"), graph.UniqueName("gqa_present_value")},
               "com.microsoft");
  *gqa.add_attribute() = MakeIntAttribute("num_heads", match.num_heads);
  *gqa.add_attribute() = MakeIntAttribute("kv_num_heads", match.num_heads / match.kv_repeat());
  *gqa.add_attribute() = MakeFloatAttribute("scale", match.scores.scale);
  const Node* fused = chain.AddNode(std::move(gqa));
  if (match.out.flattened) AddFlatten(graph, attended, match.out.output, match.hidden, fused);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
}

}  // namespace onnxopt::attention
