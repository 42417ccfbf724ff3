// com.microsoft::MultiHeadAttention from a matched block whose projections stay outside
// (attention_emit.h): LLaMA-style attention, Q and K rotated after the head split, K and V possibly
// repeated to the query heads (grouped-query attention); and any batch-first block with a LoRA
// branch on a projection (BERT with peft adapters), which must stay as the model has it, so the
// projections cannot go into Attention's packed weights.
//   q4 = Reshape(x Wq, [B,S,N,D]); q = rope(Transpose(q4));  k likewise (Nkv heads);  v = x Wv
// becomes
//   MultiHeadAttention(rope'(x Wq), repeat(rope'(x Wk)), repeat(x Wv), key_padding_mask, attention_bias)
// where rope' is the same rotation on the projections: RotaryEmbedding on [B,S,H] where
// fuse_rotary_embedding made one (its caches and position ids carried over; a partial rotation of the
// first r of each head, Phi's, as its rotary_embedding_dim), else the element-wise
// rotation on [B,S,N,D] (cos/sin unsqueezed on the head axis instead); repeat is repeat_kv on
// [B,S,Nkv*D]. Q, K and V are the projections' outputs as the head split read them: a packed
// projection's parts (Phi-3's qkv_proj) stay as the Slices or Split that take them, since the rotation
// sits between the projection and the operator; without rotation, Q and K are the projections as
// they are (bias and LoRA branch included); a norm of each head (Qwen3's q_norm, k_norm) stays on the
// heads, merged back to [B,S,H] by a Reshape before the rotation. Checked: batch-first heads, projections with constant
// weights [in, out] (or parts of one), the key/value heads times the repeat equal to the query heads.
// A causal buffer (Where over a sliced triangle, GPT-2's spelling) is the operator's unidirectional.
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/fusion/attention_emit.h"

namespace onnxopt::attention {
namespace {

// The element-wise rotation on [B,S,N,D] of the projections' head split, flattened to [B,S,H].
std::pair<std::string, std::string> RotateElementWise(Graph& graph, const AttentionMatch& match, NodeChain* chain) {
  const Rotation& rotation = *match.q_rotation;
  // The tables as they broadcast on [B,S,N,D]: [B',S,1,D] of [B',S,D] and of [B',1,S,D], [S,1,D] of [S,D].
  auto on_split_heads = [&](const std::string& table, const std::string& hint) {
    if (rotation.table_rank == 4) {
      return chain->Add("Transpose", {table}, hint, {MakeIntsAttribute("perm", {0, 2, 1, 3})});
    }
    const std::string axis = AddInt64Initializer(graph, "rotary_head_axis", {rotation.table_rank == 3 ? 2 : 1});
    return chain->Add("Unsqueeze", {table, axis}, hint);
  };
  const std::string cos = on_split_heads(rotation.cos, "rotary_cos_bsnd");
  const std::string sin = on_split_heads(rotation.sin, "rotary_sin_bsnd");
  const std::string last = AddInt64Initializer(graph, "rotary_axis", {-1});
  const std::string zero = AddInt64Initializer(graph, "rotary_zero", {0});
  const std::string half = AddInt64Initializer(graph, "rotary_half", {rotation.half});
  const std::string end = AddInt64Initializer(graph, "rotary_end", {std::numeric_limits<int64_t>::max()});
  const std::string flat = AddInt64Initializer(graph, "heads_flat", {0, 0, -1});
  const std::string one = rotation.interleaved ? AddInt64Initializer(graph, "rotary_one", {1}) : "";
  const std::string two = rotation.interleaved ? AddInt64Initializer(graph, "rotary_every_other", {2}) : "";
  // rotate_half(x) = Concat(-x[..., h:], x[..., :h]); interleaved, rotate_every_two(x) =
  // Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1), -1), Shape(x)).
  auto rotate_part = [&](const std::string& x, const std::string& hint) {
    if (!rotation.interleaved) {
      const std::string low = chain->Add("Slice", {x, zero, half, last}, hint + "_low");
      const std::string high = chain->Add("Slice", {x, half, end, last}, hint + "_high");
      const std::string negated = chain->Add("Neg", {high}, hint + "_neg");
      return chain->Add("Concat", {negated, low}, hint + "_rotate_half", {MakeIntAttribute("axis", -1)});
    }
    const std::string even = chain->Add("Slice", {x, zero, end, last, two}, hint + "_even");
    const std::string odd = chain->Add("Slice", {x, one, end, last, two}, hint + "_odd");
    const std::string negated = chain->Add("Unsqueeze", {chain->Add("Neg", {odd}, hint + "_neg"), last}, hint + "_neg_pair");
    const std::string pairs = chain->Add("Concat", {negated, chain->Add("Unsqueeze", {even, last}, hint + "_even_pair")},
                                         hint + "_pairs", {MakeIntAttribute("axis", -1)});
    return chain->Add("Reshape", {pairs, chain->Add("Shape", {x}, hint + "_shape")}, hint + "_rotate_every_two");
  };
  auto rotate = [&](const Projection& p, const std::string& hint) {
    const std::string x = p.SplitHeads();
    const std::string with_cos = chain->Add("Mul", {x, cos}, hint + "_cos");
    const std::string with_sin = chain->Add("Mul", {rotate_part(x, hint), sin}, hint + "_sin");
    const std::string rotated = chain->Add("Add", {with_cos, with_sin}, hint + "_rotated");
    return chain->Add("Reshape", {rotated, flat}, hint + "_flat");
  };
  const std::string query = rotate(match.q, "rotary_q");
  return {query, rotate(match.k, "rotary_k")};
}

// repeat_kv on [B,S,Nkv*D]: Reshape to [B,S,Nkv,1,D], Expand the 1 to rep, merge back to [B,S,N*D]
// (query head n reads KV head n / rep, as repeat_kv orders them).
std::pair<std::string, std::string> RepeatKeyAndValue(Graph& graph, const AttentionMatch& match, std::string key,
                                                      std::string value, NodeChain* chain) {
  const int64_t rep = match.kv_repeat();
  const std::string split =
      AddInt64Initializer(graph, "kv_heads_split", {0, 0, match.num_heads / rep, 1, match.head_size});
  const std::string repeats = AddInt64Initializer(graph, "kv_heads_repeat", {1, 1, 1, rep, 1});
  const std::string merge = AddInt64Initializer(graph, "kv_heads_merge", {0, 0, -1});
  auto repeat = [&](const std::string& x, const std::string& hint) {
    const std::string grouped = chain->Add("Reshape", {x, split}, hint + "_grouped");
    return chain->Add("Reshape", {chain->Add("Expand", {grouped, repeats}, hint + "_repeated"), merge}, hint);
  };
  key = repeat(key, "kv_repeat_k");
  return {key, repeat(value, "kv_repeat_v")};
}

}  // namespace

std::string ProjectedValue(Graph& graph, const Projection& p, NodeChain* chain) {
  if (p.Given()) {
    const std::string merged = AddInt64Initializer(graph, "heads_merged_shape", {0, 0, -1});
    // [B,N,S,D] (or K^T [B,N,D,S]) -> [B,S,N,D]
    const std::vector<int64_t> perm = p.given_transposed ? std::vector<int64_t>{0, 3, 1, 2}
                                                         : std::vector<int64_t>{0, 2, 1, 3};
    const std::string bsnd = chain->Add("Transpose", {p.given_heads}, "given_heads_bsnd", {MakeIntsAttribute("perm", perm)});
    return chain->Add("Reshape", {bsnd, merged}, "given_heads_merged");
  }
  if (p.head_norm == nullptr) return p.reshape->input(0);
  const std::string merged = AddInt64Initializer(graph, "heads_merged_shape", {0, 0, -1});
  return chain->Add("Reshape", {p.head_norm->output(0), merged}, "normed_heads_merged");
}

std::pair<std::string, std::string> RotatedQueryAndKey(Graph& graph, const AttentionMatch& match, NodeChain* chain) {
  if (!match.q_rotation) return {ProjectedValue(graph, match.q, chain), ProjectedValue(graph, match.k, chain)};
  const Rotation& q = *match.q_rotation;
  if (q.fused == nullptr) return RotateElementWise(graph, match, chain);
  auto rotate = [&](const std::string& x, int64_t heads, const std::string& hint) {
    std::vector<onnx::AttributeProto> attributes = {MakeIntAttribute("num_heads", heads)};
    // Partial rotation: the kernel rotates the first rotary_embedding_dim of each head, copies the rest.
    if (!q.Whole(match.head_size)) attributes.push_back(MakeIntAttribute("rotary_embedding_dim", q.rotary_dim));
    if (q.interleaved) attributes.push_back(MakeIntAttribute("interleaved", 1));
    return chain->Add("RotaryEmbedding", {x, q.position_ids, q.cos_cache, q.sin_cache}, hint, std::move(attributes),
                      "com.microsoft");
  };
  const std::string query = rotate(ProjectedValue(graph, match.q, chain), match.num_heads, "rotary_q");
  return {query, rotate(ProjectedValue(graph, match.k, chain), match.num_heads / match.kv_repeat(), "rotary_k")};
}

MatchResult<Replacement> PlanMultiHeadAttention(const Graph& graph, const ShapeInfo& shapes,
                                                const AttentionMatch& match) {
  if (match.layout != Layout::kBatchFirst) {
    return Fail("projections outside the operator: the heads are sequence-first");
  }
  if (match.stacked_cache) return Fail("a stacked past [2,B,N,P,D]: only Attention takes it as its past");
  // Each projection's width: its part of a packed projection (Phi-3's qkv_proj), else its weight's.
  auto width = [&](const Projection& p) -> std::optional<int64_t> {
    if (p.Given()) return match.num_heads / match.kv_repeat() * match.head_size;
    const onnx::TensorProto* weight = ConstantTensor(graph, p.weight);
    if (weight == nullptr || weight->dims_size() != 2) return std::nullopt;
    return p.part != nullptr ? p.size : weight->dims(1);
  };
  const std::optional<int64_t> k_width = width(match.k), v_width = width(match.v);
  if (!k_width || !v_width) return Fail("rotary attention: projection weights are not constant [in, out] matrices");
  const int64_t rep = match.kv_repeat();
  if (*k_width * rep != match.hidden || *v_width * rep != match.hidden) {
    return Fail(rep == 1 ? "rotary attention: fewer key/value heads than query heads without a repeat_kv to match"
                         : "rotary attention: the key/value heads times the repeat are not the query heads");
  }
  // A part of a packed projection has the packed projection's rank (where the part is not typed).
  auto rank = [&](const Projection& p) {
    std::optional<int> known = shapes.Rank(p.reshape->input(0));
    return known || p.part == nullptr ? known : shapes.Rank(p.part->input(0));
  };
  if (match.q_rotation && match.q_rotation->fused != nullptr && (rank(match.q) != 3 || rank(match.k) != 3)) {
    return Fail("rotary attention: the projections are not known to be [B,S,H]");
  }
  Replacement plan;
  plan.pattern = CorePattern(match);
  if (match.k_swap != nullptr) plan.pattern.push_back(match.k_swap);
  for (const auto* rotation : {&match.q_rotation, &match.k_rotation}) {
    if (!rotation->has_value()) continue;
    plan.pattern.insert(plan.pattern.end(), (*rotation)->nodes.begin(), (*rotation)->nodes.end());
  }
  for (const Projection* p : {&match.q, &match.k, &match.v}) {
    plan.pattern.insert(plan.pattern.end(), p->transposes.begin(), p->transposes.end());
  }
  std::set<Node*> targets(match.out.reshapes.begin(), match.out.reshapes.end());
  for (const auto* repeat : {&match.k_repeat, &match.v_repeat}) {
    if (!repeat->has_value()) continue;
    plan.pattern.insert(plan.pattern.end(), (*repeat)->nodes.begin(), (*repeat)->nodes.end());
    targets.insert((*repeat)->nodes.begin() + 1, (*repeat)->nodes.end());  // Expand and Reshape read sizes
  }
  ClaimCausalBuffer(graph, match, &plan.pattern, &targets);
  // A cache's Concats go too: GroupQueryAttention writes the presents again.
  std::set<std::string> reproduced;
  if (match.cache) {
    for (Node* concat : {match.cache->key_concat, match.cache->value_concat}) {
      plan.pattern.push_back(concat);
      reproduced.insert(concat->output(0));
    }
  }
  reproduced.insert(match.fresh_presents.begin(), match.fresh_presents.end());  // kept, not written again
  MatchResult<std::vector<Node*>> shape_nodes =
      ClaimPattern(graph, plan.pattern, targets, match.out.output, reproduced);
  if (!shape_nodes) return Fail(absl::StrCat("rotary attention: ", shape_nodes.reason()));
  plan.shape_nodes = *std::move(shape_nodes);
  return plan;
}

void EmitMultiHeadAttention(Graph& graph, const AttentionMatch& match, const Replacement& plan, FusionState* state,
                            PassContext& context) {
  NodeChain chain(graph, RemovePattern(graph, match, plan.pattern, plan.shape_nodes));
  const MaskPlan& mask = match.mask;
  std::string query, key, value;
  if (match.kv_in_heads_layout) {  // set only over given heads with K and V un-repeated (attention_match.h)
    query = ProjectedValue(graph, match.q, &chain);
    key = match.k.given_transposed ? chain.Add("Transpose", {match.k.given_heads}, "given_keys_bnsh",
                                               {MakeIntsAttribute("perm", {0, 1, 3, 2})})
                                   : match.k.given_heads;
    value = match.v.given_heads;
  } else {
    std::tie(query, key) = RotatedQueryAndKey(graph, match, &chain);
    value = ProjectedValue(graph, match.v, &chain);
    if (match.kv_repeat() > 1) std::tie(key, value) = RepeatKeyAndValue(graph, match, key, value, &chain);
  }
  const std::string attention_bias = AttentionBias(graph, match, state, &chain);
  std::vector<std::string> inputs = {query, key, value};
  const std::string name = graph.UniqueName("MultiHeadAttention");
  if (!mask.raw_mask.empty() || !attention_bias.empty()) inputs.push_back("");  // bias
  if (!mask.raw_mask.empty()) {
    inputs.push_back(state->int32_masks.Get(graph, mask.raw_mask, match.q.Given() ? chain.last() : match.q.matmul));  // key_padding_mask
  } else if (!attention_bias.empty()) {
    inputs.push_back("");
  }
  if (!attention_bias.empty()) inputs.push_back(attention_bias);
  const std::string attended =
      NeedsFinishing(match) ? graph.UniqueName(match.out.output + "_attention") : match.out.output;
  onnx::NodeProto mha = MakeNode("MultiHeadAttention", name, std::move(inputs), {attended}, "com.microsoft");
  *mha.add_attribute() = MakeIntAttribute("num_heads", match.num_heads);
  *mha.add_attribute() = MakeFloatAttribute("scale", match.scores.scale);
  if (mask.causal) *mha.add_attribute() = MakeIntAttribute("unidirectional", 1);
  if (!mask.raw_mask.empty()) *mha.add_attribute() = MakeFloatAttribute("mask_filter_value", mask.filter);
  const Node* fused = chain.AddNode(std::move(mha));
  CountRowsMaskedEntirely(match, *fused, state, context);
  FinishAttentionOutput(graph, context, match, attended, fused, state);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
}

void CountRowsMaskedEntirely(const AttentionMatch& match, const Node& fused, FusionState* state,
                             PassContext& context) {
  if ((!match.cache && !match.stacked_cache && match.fresh_presents.empty()) || match.mask.raw_mask.empty()) return;
  context.Count("rows_masked_entirely_differ");
  if (state->rows_masked_entirely_noted) return;
  state->rows_masked_entirely_noted = true;
  context.Note(absl::StrCat(fused.name(), " and the other layers with a key/value cache: a query that sees only "
                            "padding (left padding longer than the past) gets another softmax over its masked keys "
                            "than the original may; no unmasked position reads it, and parity skips it"));
}

std::string AttentionBias(Graph& graph, const AttentionMatch& match, FusionState* state, NodeChain* chain) {
  const MaskPlan& mask = match.mask;
  if (mask.bias_condition.empty()) {
    if (mask.bias.empty() || match.scores.clamp == nullptr) return mask.bias;
    std::string& finite = state->finite_biases[mask.bias];
    if (finite.empty()) {
      const std::string lowest = graph.UniqueName("attention_bias_floor");
      graph.AddInitializer(MakeFloatTensor(lowest, {}, {std::numeric_limits<float>::lowest()}));
      finite = chain->Add("Max", {mask.bias, lowest}, "attention_bias_finite");
    }
    return finite;
  }
  std::string& shared = state->condition_biases[mask.bias_condition];
  if (shared.empty()) {
    const std::string zero = graph.UniqueName("attention_bias_zero");
    const std::string lowest = graph.UniqueName("attention_bias_masked");
    graph.AddInitializer(MakeFloatTensor(zero, {}, {0.0f}));
    graph.AddInitializer(MakeFloatTensor(lowest, {}, {std::numeric_limits<float>::lowest()}));
    shared = chain->Add("Where", {mask.bias_condition, zero, lowest}, "attention_bias");
  }
  // A float bias beside the condition (a relative-position term): both. The lowest float plus a bias of
  // any size below 1e31 rounds to the lowest float again, so a masked score stays masked.
  if (mask.bias.empty()) return shared;
  return chain->Add("Add", {mask.bias, shared}, "attention_bias_and_mask");
}

}  // namespace onnxopt::attention
