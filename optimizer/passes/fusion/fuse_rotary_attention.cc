// fuse_attention, the rotary half: see fuse_rotary_attention.h.
#include "optimizer/passes/fusion/fuse_rotary_attention.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt::attention {
namespace {

// LLaMA-style rotary position embeddings on heads [B,N,S,D]: x * cos + rotate_half(x) * sin with
// rotate_half(x) = Concat(-x[..., h:], x[..., :h]) and cos/sin [B,S,D] unsqueezed on axis 1.
struct Rotary {
  std::vector<Node*> nodes;  // Add, both Muls, Concat, Neg, both Slices
  std::string heads;         // x
  std::string cos, sin;      // [B,S,D], before their Unsqueeze
  int64_t half = 0;
};

// The input of Unsqueeze(value, axes=[axis]).
std::optional<std::string> UnsqueezedOn(const Graph& graph, const std::string& value, int64_t axis) {
  Node* unsqueeze = ProducerWithOp(graph, value, "Unsqueeze");
  if (unsqueeze == nullptr) return std::nullopt;
  std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, *unsqueeze);
  if (!axes || *axes != std::vector<int64_t>{axis}) return std::nullopt;
  return unsqueeze->input(0);
}

// Slice(x, [start], [end], [axes: last of 4], [steps 1]).
bool LastAxisSlice(const Graph& graph, Node* slice, int64_t* start, int64_t* end) {
  if (slice == nullptr || slice->input_size() < 4) return false;
  auto starts = ConstantInts(graph, slice->input(1));
  auto ends = ConstantInts(graph, slice->input(2));
  auto axes = ConstantInts(graph, slice->input(3));
  auto steps = slice->input_size() > 4 && !slice->input(4).empty() ? ConstantInts(graph, slice->input(4))
                                                                    : std::optional<std::vector<int64_t>>(std::vector<int64_t>{1});
  if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 || axes->size() != 1 ||
      *steps != std::vector<int64_t>{1} || ((*axes)[0] != 3 && (*axes)[0] != -1)) {
    return false;
  }
  *start = (*starts)[0];
  *end = (*ends)[0];
  return true;
}

std::optional<Rotary> MatchRotary(const Graph& graph, const std::string& value) {
  Node* add = ProducerWithOp(graph, value, "Add");
  if (add == nullptr) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    Node* with_sin = ProducerWithOp(graph, add->input(side), "Mul");
    Node* with_cos = ProducerWithOp(graph, add->input(1 - side), "Mul");
    if (with_sin == nullptr || with_cos == nullptr) continue;
    for (int factor = 0; factor < 2; ++factor) {
      Node* concat = ProducerWithOp(graph, with_sin->input(factor), "Concat");
      if (concat == nullptr || concat->input_size() != 2) continue;
      const int64_t axis = concat->GetAttributeInt("axis", 0);
      Node* neg = ProducerWithOp(graph, concat->input(0), "Neg");
      Node* low = ProducerWithOp(graph, concat->input(1), "Slice");
      Node* high = neg ? ProducerWithOp(graph, neg->input(0), "Slice") : nullptr;
      int64_t low_start = 0, low_end = 0, high_start = 0, high_end = 0;
      if ((axis != -1 && axis != 3) || !LastAxisSlice(graph, low, &low_start, &low_end) ||
          !LastAxisSlice(graph, high, &high_start, &high_end) || low->input(0) != high->input(0) || low_start != 0 ||
          low_end <= 0 || high_start != low_end || high_end < 2 * low_end) {
        continue;
      }
      Rotary rotary;
      rotary.heads = low->input(0);
      rotary.half = low_end;
      const std::string sin_term = with_sin->input(1 - factor);
      std::string cos_term;
      if (with_cos->input(0) == rotary.heads) cos_term = with_cos->input(1);
      if (with_cos->input(1) == rotary.heads) cos_term = with_cos->input(0);
      auto cos = UnsqueezedOn(graph, cos_term, 1);
      auto sin = UnsqueezedOn(graph, sin_term, 1);
      if (cos_term.empty() || !cos || !sin) continue;
      rotary.cos = *cos;
      rotary.sin = *sin;
      rotary.nodes = {add, with_sin, with_cos, concat, neg, low, high};
      return rotary;
    }
  }
  return std::nullopt;
}

// transformers' repeat_kv for grouped-query attention: KV heads [B,Nkv,S,D] each used by `rep` query
// heads, as Reshape(Expand(Unsqueeze(kv, [2]), [B,Nkv,rep,S,D]), [B,Nkv*rep,S,D]).
struct KvRepeat {
  std::vector<Node*> nodes;  // Unsqueeze, Expand, Reshape
  std::string kv_heads;      // [B,Nkv,S,D]
  int64_t kv_heads_count = 0, rep = 0;
};

// True if element `index` of the shape `value` is 1 or dim `dim` of `shaped`: an Expand keeps that dim.
bool KeepsDim(const Graph& graph, const ShapeInfo& shapes, const std::string& value, size_t index,
              const std::string& shaped, int dim) {
  auto ints = ConstantInts(graph, value);
  if (!ints) ints = shapes.KnownValue(value);
  if (ints && index < ints->size() && (*ints)[index] == 1) return true;
  return ElementIsDim(graph, shapes, value, index, shaped, dim);
}

std::optional<int64_t> KnownElement(const Graph& graph, const ShapeInfo& shapes, const std::string& value,
                                    size_t index, size_t size) {
  auto ints = ConstantInts(graph, value);
  if (!ints) ints = shapes.KnownValue(value);
  if (ints && ints->size() == size) return (*ints)[index];
  const auto* symbolic = shapes.SymbolicValue(value);
  if (symbolic != nullptr && symbolic->size() == size && (*symbolic)[index].has_dim_value()) {
    return (*symbolic)[index].dim_value();
  }
  return std::nullopt;
}

std::optional<KvRepeat> MatchKvRepeat(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  Node* reshape = ProducerWithOp(graph, value, "Reshape");
  Node* expand = reshape != nullptr ? ProducerWithOp(graph, reshape->input(0), "Expand") : nullptr;
  if (expand == nullptr) return std::nullopt;
  auto kv = UnsqueezedOn(graph, expand->input(0), 2);
  if (!kv || shapes.Rank(*kv) != 4) return std::nullopt;
  const std::string& sizes = expand->input(1);
  const std::string& target = reshape->input(1);
  auto kv_count = KnownElement(graph, shapes, sizes, 1, 5);
  auto rep = KnownElement(graph, shapes, sizes, 2, 5);
  auto merged = KnownElement(graph, shapes, target, 1, 4);
  if (!kv_count || !rep || !merged || *kv_count < 1 || *rep < 2 || *merged != *kv_count * *rep ||
      !shapes.DimValue(*kv, 1) || *shapes.DimValue(*kv, 1) != *kv_count) {
    return std::nullopt;
  }
  // The Expand keeps B, S and D; the Reshape merges only the KV and repeat axes.
  if (!KeepsDim(graph, shapes, sizes, 0, *kv, 0) || !KeepsDim(graph, shapes, sizes, 3, *kv, 2) ||
      !KeepsDim(graph, shapes, sizes, 4, *kv, 3) || !ElementIsDim(graph, shapes, target, 0, *kv, 0) ||
      !ElementIsDim(graph, shapes, target, 2, *kv, 2) || !ElementIsDim(graph, shapes, target, 3, *kv, 3)) {
    return std::nullopt;
  }
  KvRepeat repeat;
  repeat.nodes = {graph.Producer(expand->input(0)), expand, reshape};
  repeat.kv_heads = *kv;
  repeat.kv_heads_count = *kv_count;
  repeat.rep = *rep;
  return repeat;
}

// True if `table` is op(Concat(t, t)) on the last axis of a rank-3 t, then scalar Muls/Divs and
// Casts to float: Hugging Face's cat(freqs, freqs).cos() * attention_scaling. Both halves of its last
// axis then hold the same values, and the first half is the cache RotaryEmbedding reads.
bool IsDuplicatedHalfTable(const Graph& graph, const ShapeInfo& shapes, const std::string& table, const char* op) {
  std::string value = table;
  for (int depth = 0; depth < 4; ++depth) {
    Node* node = graph.Producer(value);
    if (node == nullptr || !node->domain().empty()) return false;
    if (node->op_type() == "Cast" && node->GetAttributeInt("to", 0) == onnx::TensorProto::FLOAT) {
      value = node->input(0);
    } else if (auto scaled = ScalarScale(graph, node)) {
      value = scaled->second;
    } else {
      break;
    }
  }
  Node* trig = ProducerWithOp(graph, value, op);
  Node* concat = trig != nullptr ? ProducerWithOp(graph, trig->input(0), "Concat") : nullptr;
  if (concat == nullptr || concat->input_size() != 2 || concat->input(0) != concat->input(1)) return false;
  std::optional<int> rank = shapes.Rank(concat->input(0));
  if (Node* transpose = ProducerWithOp(graph, concat->input(0), "Transpose"); !rank && transpose != nullptr) {
    rank = static_cast<int>(PermOf(transpose).size());
  }
  const int64_t axis = concat->GetAttributeInt("axis", 0);
  return rank == 3 && (axis == -1 || axis == 2);
}

// A scalar int64 initializer.
std::string AddScalarInt64(Graph& graph, const std::string& hint, int64_t value) {
  return graph.AddInitializer(MakeIntScalar(graph.UniqueName(hint), onnx::TensorProto::INT64, value))->name();
}

}  // namespace

// True if `heads` is x * cos + rotate_half(x) * sin: an Add of two Muls, one of them reading a Concat
// whose first part is negated (LLaMA-style rotary position embeddings).
bool HasRotaryEmbedding(const Graph& graph, const std::string& heads) {
  std::string value = heads;
  if (Node* transpose = ProducerWithOp(graph, value, "Transpose")) value = transpose->input(0);  // K^T
  Node* add = ProducerWithOp(graph, value, "Add");
  if (add == nullptr) return false;
  for (const std::string& term : add->proto().input()) {
    Node* mul = ProducerWithOp(graph, term, "Mul");
    if (mul == nullptr) continue;
    for (const std::string& factor : mul->proto().input()) {
      Node* concat = ProducerWithOp(graph, factor, "Concat");
      if (concat != nullptr && concat->input_size() == 2 && ProducerWithOp(graph, concat->input(0), "Neg") != nullptr) {
        return true;
      }
    }
  }
  return false;
}

// LLaMA-style attention, Q and K rotated after the head split, into MultiHeadAttention:
//   q4 = Reshape(x Wq, [B,S,N,D]); q = Transpose(q4) * cos + rotate_half(Transpose(q4)) * sin; ...
// becomes the same rotation on q4 itself (cos/sin unsqueezed on the head axis instead), then
//   MultiHeadAttention(Reshape(q4_rotated, [B,S,H]), Reshape(k4_rotated, [B,S,H]), x Wv, attention_bias)
// The projections stay as they are; the mask term becomes attention_bias (-inf as the lowest float).
bool FuseRotaryAttention(Graph& graph, Node* softmax, const ShapeInfo& shapes, PassContext& context,
                         const Scores& scores, const std::vector<Node*>& nan_guard, Node* context_matmul,
                         const ContextOutput& out, FusionState* state, std::string* reason) {
  const Perm plain{0, 2, 1, 3};
  Node* k_swap = ProducerWithOp(graph, scores.k_heads, "Transpose");
  auto q_rotary = MatchRotary(graph, scores.q_heads);
  // Grouped-query attention: K (after its rotation) and V repeated to the query heads.
  std::optional<KvRepeat> k_repeat, v_repeat;
  std::string k_rotated = k_swap != nullptr && PermOf(k_swap) == Perm{0, 1, 3, 2} ? k_swap->input(0) : "";
  std::string v_heads = context_matmul->input(1);
  if (!k_rotated.empty() && (k_repeat = MatchKvRepeat(graph, shapes, k_rotated))) k_rotated = k_repeat->kv_heads;
  if ((v_repeat = MatchKvRepeat(graph, shapes, v_heads))) v_heads = v_repeat->kv_heads;
  if (k_repeat.has_value() != v_repeat.has_value() ||
      (k_repeat && (k_repeat->rep != v_repeat->rep || k_repeat->kv_heads_count != v_repeat->kv_heads_count))) {
    *reason = "rotary attention: K and V are not repeated to the query heads alike (grouped-query attention)";
    return false;
  }
  auto k_rotary = k_rotated.empty() ? std::nullopt : MatchRotary(graph, k_rotated);
  Projection q, k, v;
  if (!q_rotary || !k_rotary || q_rotary->cos != k_rotary->cos || q_rotary->sin != k_rotary->sin ||
      !MatchProjection(graph, shapes, q_rotary->heads, {plain}, &q) ||
      !MatchProjection(graph, shapes, k_rotary->heads, {plain}, &k) ||
      !MatchProjection(graph, shapes, v_heads, {plain}, &v)) {
    *reason = "Q and K carry rotary position embeddings in a form not recognized";
    return false;
  }
  const int64_t rep = k_repeat ? k_repeat->rep : 1;
  const onnx::TensorProto* q_weight = ConstantTensor(graph, q.weight);
  const onnx::TensorProto* k_weight = ConstantTensor(graph, k.weight);
  const onnx::TensorProto* v_weight = ConstantTensor(graph, v.weight);
  if (q_weight == nullptr || k_weight == nullptr || v_weight == nullptr || q_weight->dims_size() != 2 ||
      k_weight->dims_size() != 2 || v_weight->dims_size() != 2 || q.part != nullptr) {
    *reason = "rotary attention: projection weights are not constant [in, out] matrices";
    return false;
  }
  const int64_t hidden = q_weight->dims(1);
  if (k_weight->dims(1) * rep != hidden || v_weight->dims(1) * rep != hidden) {
    *reason = rep == 1 ? "rotary attention: fewer key/value heads than query heads without a repeat_kv to match"
                       : "rotary attention: the key/value heads times the repeat are not the query heads";
    return false;
  }
  if (out.flattened && out.flat_width != hidden) {
    *reason = "rotary attention: the context is flattened to another width than the attention's";
    return false;
  }
  int64_t num_heads = 0, head_size = 0;
  if (!HeadCounts(graph, shapes, context, Layout::kBatchFirst, q, hidden, &num_heads, &head_size) ||
      2 * q_rotary->half != head_size || 2 * k_rotary->half != head_size) {
    *reason = "rotary attention: the heads or the rotated half are not known to match";
    return false;
  }
  // The mask term: a boolean Where whose meaning the probe knows becomes MultiHeadAttention's own
  // masking (key_padding_mask of the raw [B, T] mask, unidirectional), which spares the mask's
  // subgraph and, with no mask at all, lets ONNX Runtime take its flash-attention kernel; another
  // boolean Where becomes a float bias with a finite fill; another float term goes in as it is.
  std::string bias_cond, raw_mask;
  std::string bias = scores.mask_add != nullptr ? scores.mask_term : "";
  float mask_filter = 0.0f;
  bool causal = false;
  std::string not_native;
  if (!bias.empty() &&
      MatchBooleanMask(graph, context, bias, &state->probed, &raw_mask, &mask_filter, &causal, &not_native)) {
    bias.clear();
  }
  if (!bias.empty()) {
    Node* where = ProducerWithOp(graph, bias, "Where");
    auto zero = where ? ConstantScalarFloat(graph, where->input(1)) : std::nullopt;
    auto fill = where ? ConstantScalarFloat(graph, where->input(2)) : std::nullopt;
    const bool boolean = zero && *zero == 0.0f && fill && *fill <= -1e4f;
    bool fits = FitsAttentionBias(shapes, bias, softmax->input(0), num_heads);
    if (boolean && !fits) {  // shapes unknown (opset 20): the probe saw [B|1, 1, L, L] at every length
      const MaskMeaning& meaning = ProbeOnce(graph, context, where->input(0), &state->probed);
      fits = meaning.kind != MaskMeaning::Kind::kUnknown && meaning.bias_shaped;
    }
    if (!fits) {
      *reason = "rotary attention: the mask is not a [B|1, N|1, S, T] term with the scores' S and T";
      return false;
    }
    if (boolean) bias_cond = where->input(0);
  }
  if (scores.causal_where != nullptr) {
    *reason = "rotary attention: a causal buffer mask is not supported here";
    return false;
  }
  std::vector<Node*> pattern = {softmax, scores.qk, context_matmul, k_swap};
  pattern.insert(pattern.end(), nan_guard.begin(), nan_guard.end());
  pattern.insert(pattern.end(), out.nodes.begin(), out.nodes.end());
  pattern.insert(pattern.end(), scores.pre_scales.begin(), scores.pre_scales.end());
  if (scores.post_scale != nullptr) pattern.push_back(scores.post_scale);
  if (scores.mask_add != nullptr) pattern.push_back(scores.mask_add);
  for (const Rotary* rotary : {&*q_rotary, &*k_rotary}) pattern.insert(pattern.end(), rotary->nodes.begin(), rotary->nodes.end());
  for (const Projection* p : {&q, &k, &v}) pattern.insert(pattern.end(), p->transposes.begin(), p->transposes.end());
  std::set<Node*> targets(out.reshapes.begin(), out.reshapes.end());
  for (const auto* repeat : {&k_repeat, &v_repeat}) {
    if (!repeat->has_value()) continue;
    pattern.insert(pattern.end(), (*repeat)->nodes.begin(), (*repeat)->nodes.end());
    targets.insert((*repeat)->nodes.begin() + 1, (*repeat)->nodes.end());  // Expand and Reshape read sizes
  }
  const std::set<Node*> members(pattern.begin(), pattern.end());
  std::vector<Node*> shape_nodes;
  if (!OnlyReadInside(graph, pattern, members, targets, out.output, &shape_nodes, reason)) {
    *reason = absl::StrCat("rotary attention: ", *reason);
    return false;
  }

  // RotaryEmbedding reads [B,S,H] projections and cos/sin caches, which the tables give when each is
  // the function of a duplicated half (IsDuplicatedHalfTable); else the rotation stays element-wise.
  const std::string q3 = q.reshape->input(0), k3 = k.reshape->input(0);
  const bool table_form = context.OpsetVersion("") >= 11 && shapes.Rank(q3) == 3 && shapes.Rank(k3) == 3 &&
                          IsDuplicatedHalfTable(graph, shapes, q_rotary->cos, "Cos") &&
                          IsDuplicatedHalfTable(graph, shapes, q_rotary->sin, "Sin");

  // Rewrite: the rotation, then MultiHeadAttention over the [B,S,H] projections.
  Node* anchor = out.nodes.back();
  for (Node* node : pattern) graph.RemoveNode(node);
  for (Node* node : shape_nodes) {
    if (!node->removed()) graph.RemoveNode(node);
  }
  const Node* at = anchor;
  auto add_node = [&](const std::string& op, std::vector<std::string> inputs, const std::string& hint,
                      std::vector<onnx::AttributeProto> attributes = {}, const std::string& domain = "") {
    onnx::NodeProto node;
    node.set_op_type(op);
    node.set_domain(domain);
    node.set_name(graph.UniqueName(hint));
    for (auto& input : inputs) node.add_input(input);
    const std::string output = graph.UniqueName(hint);
    node.add_output(output);
    for (auto& attribute : attributes) *node.add_attribute() = std::move(attribute);
    at = graph.AddNode(std::move(node), at, /*after=*/true);
    return output;
  };
  auto ints = [&](const std::string& hint, std::vector<int64_t> values) {
    const std::string name = graph.UniqueName(hint);
    graph.AddInitializer(MakeInt64Tensor(name, values));
    return name;
  };
  std::string query, key;
  if (table_form) {
    // rope' = RotaryEmbedding on the [B,S,H] projections. Its caches are the first halves of the
    // cos/sin tables [B',S,D] (B' = 1 or B) as rows [B'*S, D/2], and position (b, s) reads row
    // (b mod B')*S + s: the offset 0 where B' is known to be 1, else
    // Expand(Reshape(Range(0, B'*S), [-1, S]), [B, S]). Built once per table pair.
    RotaryInputs& shared = state->rotary_inputs[absl::StrCat(q_rotary->cos, "\n", q_rotary->sin)];
    if (shared.cos_cache.empty()) {
      const std::string zero = ints("rotary_zero", {0});
      const std::string half = ints("rotary_half", {q_rotary->half});
      const std::string last = ints("rotary_axis", {-1});
      const std::string rows_shape = ints("rotary_cache_rows", {-1, q_rotary->half});
      auto cache = [&](const std::string& table, const std::string& hint) {
        const std::string first_half = add_node("Slice", {table, zero, half, last}, hint + "_half");
        return add_node("Reshape", {first_half, rows_shape}, hint);
      };
      shared.cos_cache = cache(q_rotary->cos, "rotary_cos_cache");
      shared.sin_cache = cache(q_rotary->sin, "rotary_sin_cache");
      if (shapes.DimValue(q_rotary->cos, 0) == 1 && shapes.DimValue(q_rotary->sin, 0) == 1) {
        // B' = 1 (positions shared by the batch, Hugging Face's arange): row s, RotaryEmbedding's
        // position offset form.
        shared.position_ids = zero;
      }
    }
    if (shared.position_ids.empty()) {
      const std::string zero = ints("rotary_zero", {0});
      const std::string one = ints("rotary_one", {1});
      const std::string two = ints("rotary_two", {2});
      const std::string last = ints("rotary_axis", {-1});
      const std::string rows = add_node("Gather", {add_node("Shape", {shared.cos_cache}, "rotary_cache_shape"),
                                                   AddScalarInt64(graph, "rotary_rows_index", 0)},
                                        "rotary_cache_rows_count", {IntAttribute("axis", 0)});
      const std::string row_ids = add_node("Range", {AddScalarInt64(graph, "rotary_range_start", 0), rows,
                                                     AddScalarInt64(graph, "rotary_range_step", 1)},
                                           "rotary_row_ids");
      const std::string input_shape = add_node("Shape", {q3}, "rotary_input_shape");
      const std::string batch_and_length = add_node("Slice", {input_shape, zero, two}, "rotary_batch_and_length");
      const std::string length = add_node("Slice", {input_shape, one, two}, "rotary_length");
      const std::string by_length = add_node("Concat", {last, length}, "rotary_rows_by_length", {IntAttribute("axis", 0)});
      const std::string table_positions = add_node("Reshape", {row_ids, by_length}, "rotary_table_positions");
      shared.position_ids = add_node("Expand", {table_positions, batch_and_length}, "rotary_position_ids");
    }
    auto rotate = [&](const std::string& x, int64_t heads, const std::string& hint) {
      return add_node("RotaryEmbedding", {x, shared.position_ids, shared.cos_cache, shared.sin_cache}, hint,
                      {IntAttribute("num_heads", heads)}, "com.microsoft");
    };
    query = rotate(q3, num_heads, "rotary_q");
    key = rotate(k3, num_heads / rep, "rotary_k");
  } else {
    // rope' = the same element-wise rotation on [B,S,N,D] (cos/sin unsqueezed on the head axis).
    const std::string head_axis = ints("rotary_head_axis", {2});
    const std::string cos = add_node("Unsqueeze", {q_rotary->cos, head_axis}, "rotary_cos_bsnd");
    const std::string sin = add_node("Unsqueeze", {q_rotary->sin, head_axis}, "rotary_sin_bsnd");
    const std::string last = ints("rotary_axis", {-1});
    const std::string zero = ints("rotary_zero", {0});
    const std::string half = ints("rotary_half", {q_rotary->half});
    const std::string end = ints("rotary_end", {std::numeric_limits<int64_t>::max()});
    const std::string flat = ints("heads_flat", {0, 0, -1});
    auto rotate = [&](const Projection& p, const std::string& hint) {
      const std::string x = p.reshape->output(0);
      const std::string low = add_node("Slice", {x, zero, half, last}, hint + "_low");
      const std::string high = add_node("Slice", {x, half, end, last}, hint + "_high");
      const std::string negated = add_node("Neg", {high}, hint + "_neg");
      const std::string rotated_half =
          add_node("Concat", {negated, low}, hint + "_rotate_half", {IntAttribute("axis", -1)});
      const std::string with_cos = add_node("Mul", {x, cos}, hint + "_cos");
      const std::string with_sin = add_node("Mul", {rotated_half, sin}, hint + "_sin");
      const std::string rotated = add_node("Add", {with_cos, with_sin}, hint + "_rotated");
      return add_node("Reshape", {rotated, flat}, hint + "_flat");
    };
    query = rotate(q, "rotary_q");
    key = rotate(k, "rotary_k");
  }
  std::string value = v.reshape->input(0);
  if (rep > 1) {
    // repeat_kv on [B,S,Nkv*D]: Reshape to [B,S,Nkv,1,D], Expand the 1 to rep, merge back to [B,S,N*D]
    // (query head n reads KV head n / rep, as repeat_kv orders them).
    const std::string split = ints("kv_heads_split", {0, 0, num_heads / rep, 1, head_size});
    const std::string repeats = ints("kv_heads_repeat", {1, 1, 1, rep, 1});
    const std::string merge = ints("kv_heads_merge", {0, 0, -1});
    auto repeat = [&](const std::string& x, const std::string& hint) {
      const std::string grouped = add_node("Reshape", {x, split}, hint + "_grouped");
      return add_node("Reshape", {add_node("Expand", {grouped, repeats}, hint + "_repeated"), merge}, hint);
    };
    key = repeat(key, "kv_repeat_k");
    value = repeat(value, "kv_repeat_v");
  }
  std::string attention_bias = bias;
  if (!bias_cond.empty()) {
    const std::string zero_f = graph.UniqueName("attention_bias_zero");
    const std::string lowest = graph.UniqueName("attention_bias_masked");
    graph.AddInitializer(MakeFloatTensor(zero_f, {}, {0.0f}));
    graph.AddInitializer(MakeFloatTensor(lowest, {}, {std::numeric_limits<float>::lowest()}));
    attention_bias = add_node("Where", {bias_cond, zero_f, lowest}, "attention_bias");
  }
  onnx::NodeProto mha;
  mha.set_op_type("MultiHeadAttention");
  mha.set_domain("com.microsoft");
  mha.set_name(graph.UniqueName("MultiHeadAttention"));
  for (const std::string& input : {query, key, value}) mha.add_input(input);
  if (!raw_mask.empty() || !attention_bias.empty()) mha.add_input("");  // bias
  if (!raw_mask.empty()) {
    auto known = state->int32_masks.find(raw_mask);
    if (known == state->int32_masks.end()) {
      known = state->int32_masks.emplace(raw_mask, AddCast(graph, raw_mask, onnx::TensorProto::INT32, q.matmul)).first;
    }
    mha.add_input(known->second);  // key_padding_mask
  } else if (!attention_bias.empty()) {
    mha.add_input("");
  }
  if (!attention_bias.empty()) mha.add_input(attention_bias);
  const std::string attended = out.flattened ? graph.UniqueName(out.output + "_attention") : out.output;
  mha.add_output(attended);
  *mha.add_attribute() = IntAttribute("num_heads", num_heads);
  *mha.add_attribute() = FloatAttribute("scale", scores.scale);
  if (causal) *mha.add_attribute() = IntAttribute("unidirectional", 1);
  if (!raw_mask.empty()) *mha.add_attribute() = FloatAttribute("mask_filter_value", mask_filter);
  at = graph.AddNode(std::move(mha), at, /*after=*/true);
  if (out.flattened) AddFlatten(graph, attended, out.output, hidden, at);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
  return true;
}

}  // namespace onnxopt::attention
