// com.microsoft::GroupQueryAttention from a matched grouped-query block (attention_emit.h):
//   y = GroupQueryAttention(rope'(x Wq), rope'(x Wk), x Wv, , , seqlens_k, total_sequence_length, , , ,
//                           attention_bias, num_heads=N, kv_num_heads=Nkv, scale)
// K and V stay at their Nkv heads (no repeat_kv: the kernel reads each key/value head for its group of
// N / Nkv query heads); rope' as for MultiHeadAttention, or inside the kernel (do_rotary, the caches as
// cos_cache/sin_cache) where its own positions 0..S-1 read the rows RotaryEmbedding read (offset 0, no
// past): one node less per Q and K and per layer. The kernel is causal and takes each row as
// seqlens_k[b] + 1 valid tokens from the start; here every row is taken whole (seqlens_k = S - 1,
// total_sequence_length = S) and whatever else the original's mask masks goes in as attention_bias:
// the key padding of a causal + padding mask as Where(mask[b, t] != 0, 0, filter) [B, 1, S, T] (made
// once per mask input and shared by the layers), another mask as Where(cond, 0, lowest). Exact where
// the mask never lets a query see a later key (MaskPlan::within_causal: the probe checks it), so the
// kernel's own causal masking removes nothing the original kept; left padding included. A float bias
// (T5's) and head sizes the CPU kernel does not take (multiples of 8 only) keep MultiHeadAttention.
// With a key/value cache (AttentionMatch::cache) the past goes in as past_key/past_value, the total
// length is P + S (seqlens_k = P + S - 1 for every row: the kernel writes the new keys at P, as the
// original's Concat does), and the node writes the model's present outputs itself.
#include "optimizer/passes/fusion/attention_emit.h"

#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace onnxopt::attention {
namespace {

// The key padding of the [B, T] mask `raw_mask` as a bias [B, 1, S, T] for queries [B, S, H].
std::string PaddingBias(Graph& graph, const std::string& raw_mask, float filter, const std::string& query,
                        NodeChain* chain) {
  const std::string zero = graph.UniqueName("padding_bias_zero");
  const std::string masked = graph.UniqueName("padding_bias_masked");
  graph.AddInitializer(MakeFloatTensor(zero, {}, {0.0f}));
  graph.AddInitializer(MakeFloatTensor(masked, {}, {filter}));
  const std::string keys =
      chain->Add("Unsqueeze", {raw_mask, AddInt64Initializer(graph, "padding_bias_axes", {1, 2})}, "padding_keys");
  const std::string kept =
      chain->Add("Cast", {keys}, "padding_kept", {MakeIntAttribute("to", onnx::TensorProto::BOOL)});
  const std::string row = chain->Add("Where", {kept, zero, masked}, "padding_bias_row");  // [B, 1, 1, T]
  const std::string length = chain->Add("Slice",
                                        {chain->Add("Shape", {query}, "padding_query_shape"),
                                         AddInt64Initializer(graph, "padding_length_start", {1}),
                                         AddInt64Initializer(graph, "padding_length_end", {2})},
                                        "padding_query_length");
  const std::string one = AddInt64Initializer(graph, "padding_one", {1});
  const std::string rows = chain->Add("Concat", {one, one, length, one}, "padding_bias_rows",
                                      {MakeIntAttribute("axis", 0)});
  return chain->Add("Expand", {row, rows}, "padding_bias");
}

// The rotation goes inside the kernel (do_rotary) where the kernel's own positions read the same cache
// rows RotaryEmbedding reads: a whole-head rotation at offset 0 (row s for token s) and no past (the
// kernel then counts 0..S-1), with cache rows a multiple of 8 wide (the kernel's rule).
bool RotatesInside(const Graph& graph, const AttentionMatch& match) {
  if (!match.q_rotation || match.q_rotation->fused == nullptr || match.cache) return false;
  const Rotation& q = *match.q_rotation;
  if (!q.Whole(match.head_size) || (match.head_size / 2) % 8 != 0) return false;
  const std::optional<std::vector<int64_t>> offset = ConstantInts(graph, q.position_ids);
  return offset && offset->size() == 1 && (*offset)[0] == 0;
}

}  // namespace

bool GroupQueryAttentionFits(const AttentionMatch& match) {
  const MaskPlan& mask = match.mask;
  // ONNX Runtime's CPU kernel takes head sizes of multiples of 8 only.
  return (match.k_repeat.has_value() || match.cache.has_value()) && match.head_size % 8 == 0 && mask.within_causal &&
         mask.bias.empty();
}

void EmitGroupQueryAttention(Graph& graph, const AttentionMatch& match, const Replacement& plan, FusionState* state,
                             PassContext& context) {
  const bool rotates_inside = RotatesInside(graph, match);
  NodeChain chain(graph, RemovePattern(graph, match, plan.pattern, plan.shape_nodes));
  std::string query, key;
  if (rotates_inside) {
    query = ProjectedValue(graph, match.q, &chain);
    key = ProjectedValue(graph, match.k, &chain);
  } else {
    std::tie(query, key) = RotatedQueryAndKey(graph, match, &chain);
  }
  const std::string value = ProjectedValue(graph, match.v, &chain);
  const MaskPlan& mask = match.mask;
  std::string attention_bias = AttentionBias(graph, mask, state, &chain);
  if (!mask.raw_mask.empty()) {
    std::string& shared = state->padding_biases[mask.raw_mask];
    if (shared.empty()) shared = PaddingBias(graph, mask.raw_mask, mask.filter, query, &chain);
    attention_bias = shared;
  }
  // B and S of the query [B,S,H]: seqlens_k = S - 1 per row (int32 [B]), total_sequence_length = S.
  const std::string shape = chain.Add("Shape", {query}, "gqa_query_shape");
  const std::string batch = chain.Add("Gather", {shape, AddInt64Scalar(graph, "gqa_batch_index", 0)}, "gqa_batch",
                                      {MakeIntAttribute("axis", 0)});
  const std::string length = chain.Add("Gather", {shape, AddInt64Scalar(graph, "gqa_length_index", 1)}, "gqa_length",
                                       {MakeIntAttribute("axis", 0)});
  // With a cache the keys are the past's and the new ones: T = P + S.
  std::string keys = length;
  if (match.cache) {
    const std::string past_shape = chain.Add("Shape", {match.cache->past_key}, "gqa_past_shape");
    const std::string past = chain.Add("Gather", {past_shape, AddInt64Scalar(graph, "gqa_past_index", 2)},
                                       "gqa_past_length", {MakeIntAttribute("axis", 0)});
    keys = chain.Add("Add", {past, length}, "gqa_total_length");
  }
  const std::string total = chain.Add("Cast", {keys}, "gqa_total_sequence_length",
                                      {MakeIntAttribute("to", onnx::TensorProto::INT32)});
  const std::string last = chain.Add("Sub", {keys, AddInt64Scalar(graph, "gqa_one", 1)}, "gqa_last_position");
  const std::string rows = chain.Add("Unsqueeze", {batch, AddInt64Initializer(graph, "gqa_axes", {0})}, "gqa_rows");
  const std::string seqlens = chain.Add(
      "Cast", {chain.Add("Expand", {last, rows}, "gqa_seqlens_int64")}, "gqa_seqlens_k",
      {MakeIntAttribute("to", onnx::TensorProto::INT32)});
  const std::string attended =
      NeedsFinishing(match) ? graph.UniqueName(match.out.output + "_attention") : match.out.output;
  std::vector<std::string> inputs = {query, key, value, "", "", seqlens, total};
  std::vector<std::string> outputs = {attended, graph.UniqueName("gqa_present_key"),
                                      graph.UniqueName("gqa_present_value")};
  if (match.cache) {
    inputs[3] = match.cache->past_key;
    inputs[4] = match.cache->past_value;
    outputs[1] = match.cache->key_concat->output(0);  // the presents, written again
    outputs[2] = match.cache->value_concat->output(0);
  }
  if (rotates_inside) {
    inputs.insert(inputs.end(), {match.q_rotation->cos_cache, match.q_rotation->sin_cache});
  } else if (!attention_bias.empty()) {
    inputs.insert(inputs.end(), {"", ""});  // no cos_cache, sin_cache
  }
  if (!attention_bias.empty()) inputs.insert(inputs.end(), {"", attention_bias});  // position_ids, attention_bias
  onnx::NodeProto gqa = MakeNode("GroupQueryAttention", graph.UniqueName("GroupQueryAttention"), std::move(inputs),
                                 std::move(outputs), "com.microsoft");
  *gqa.add_attribute() = MakeIntAttribute("num_heads", match.num_heads);
  *gqa.add_attribute() = MakeIntAttribute("kv_num_heads", match.num_heads / match.kv_repeat());
  *gqa.add_attribute() = MakeFloatAttribute("scale", match.scores.scale);
  if (rotates_inside) {
    *gqa.add_attribute() = MakeIntAttribute("do_rotary", 1);
    *gqa.add_attribute() = MakeIntAttribute("rotary_interleaved", match.q_rotation->interleaved ? 1 : 0);
  }
  const Node* fused = chain.AddNode(std::move(gqa));
  if (match.cache && !state->cache_noted) {
    state->cache_noted = true;
    context.Note(absl::StrCat(fused->name(), " and the other layers' with the key/value cache run a prefill (no past) "
                              "and one-token steps at any batch size; more than one new token after a past only at "
                              "batch 1 (ONNX Runtime's GroupQueryAttention refuses it at batch > 1)"));
  }
  FinishAttentionOutput(graph, context, match, attended, fused, state);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
}

}  // namespace onnxopt::attention
