// Q, K and V of an attention block: head-split projections, rotated or repeated (attention_match.h).
#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/fusion/attention_match.h"
#include "optimizer/passes/lora_branch.h"

namespace onnxopt::attention {
namespace {

// The part of a packed projection `value` is: output `index` of a Split, or a Slice, on the last axis.
bool MatchPackedPart(const Graph& graph, const ShapeInfo& shapes, const std::string& value, Projection* projection) {
  Node* producer = graph.Producer(value);
  if (producer == nullptr || !producer->domain().empty()) return false;
  const auto rank = shapes.Rank(producer->input(0));
  if (!rank) return false;
  auto last_axis = [&](int64_t axis) { return axis == -1 || axis == *rank - 1; };
  if (producer->op_type() == "Split") {
    std::optional<std::vector<int64_t>> sizes;
    if (producer->input_size() > 1 && !producer->input(1).empty()) {
      sizes = ConstantInts(graph, producer->input(1));
    } else if (const onnx::AttributeProto* split = producer->FindAttribute("split")) {
      sizes = std::vector<int64_t>(split->ints().begin(), split->ints().end());
    } else if (const int64_t parts = producer->GetAttributeInt("num_outputs", 0); parts > 0) {
      // Opset 18's equal split: the width from shapes, or from the projection weight [in, W].
      std::optional<int64_t> width = shapes.DimValue(producer->input(0), -1);
      if (Node* matmul = ProducerWithOp(graph, producer->input(0), "MatMul"); !width && matmul != nullptr) {
        const onnx::TensorProto* weight = ConstantTensor(graph, matmul->input(1));
        if (weight != nullptr && weight->dims_size() == 2) width = weight->dims(1);
      }
      if (width && *width % parts == 0) sizes = std::vector<int64_t>(static_cast<size_t>(parts), *width / parts);
    }
    if (!sizes || static_cast<int>(sizes->size()) != producer->output_size() ||
        !last_axis(producer->GetAttributeInt("axis", 0))) {
      return false;
    }
    int64_t offset = 0;
    for (int i = 0; i < producer->output_size(); ++i) {
      if (producer->output(i) == value) {
        projection->part = producer;
        projection->offset = offset;
        projection->size = (*sizes)[static_cast<size_t>(i)];
        return true;
      }
      offset += (*sizes)[static_cast<size_t>(i)];
    }
    return false;
  }
  if (producer->op_type() != "Slice" || producer->input_size() < 4) return false;  // the axis is given
  const std::optional<SliceSpec> spec = ParseSlice(graph, *producer);
  const auto width = shapes.DimValue(producer->input(0), -1);
  if (!spec || !spec->starts || !spec->ends || !spec->OneAxis(-1, *rank) || !width || (*spec->starts)[0] < 0) {
    return false;
  }
  const int64_t start = (*spec->starts)[0], end = std::min((*spec->ends)[0], *width);
  if (end <= start) return false;
  projection->part = producer;
  projection->offset = start;
  projection->size = end - start;
  return true;
}

// The norm that produces `value`: over each head's D of [B,S,N,D] (Qwen3's q_norm / k_norm) or over
// the whole projection [B,S,H] (OLMo 2's): a (Simplified)LayerNormalization on the last axis with
// constant 1-D scale (and bias) and one output.
Node* LastAxisNorm(const Graph& graph, const std::string& value) {
  Node* norm = graph.Producer(value);
  if (norm == nullptr || !norm->domain().empty() ||
      (norm->op_type() != "SimplifiedLayerNormalization" && norm->op_type() != "LayerNormalization") ||
      norm->output_size() != 1 || norm->input_size() < 2) {
    return nullptr;
  }
  const int64_t axis = norm->GetAttributeInt("axis", -1);
  const onnx::TensorProto* scale = ConstantTensor(graph, norm->input(1));
  if ((axis != -1 && axis != 3) || scale == nullptr || scale->dims_size() != 1) return nullptr;
  if (norm->input_size() > 2 && !norm->input(2).empty() && ConstantTensor(graph, norm->input(2)) == nullptr) {
    return nullptr;
  }
  return norm;
}

// True if element `index` of the shape `value` is 1 or dim `dim` of `shaped`: an Expand keeps that dim.
bool KeepsDim(const Graph& graph, const ShapeInfo& shapes, const std::string& value, size_t index,
              const std::string& shaped, int dim) {
  auto ints = ConstantInts(graph, value);
  if (!ints) ints = shapes.KnownValue(value);
  if (ints && index < ints->size() && (*ints)[index] == 1) return true;
  return ElementIsDim(graph, shapes, value, index, shaped, dim);
}

// repeat_kv as Expand (transformers) or as Tile (Tensor.repeat(1, 1, rep, 1, 1)) of the unsqueezed KV heads.
std::optional<KvRepeat> MatchKvRepeat(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  Node* reshape = ProducerWithOp(graph, value, "Reshape");
  Node* expand = reshape != nullptr ? ProducerWithOp(graph, reshape->input(0), "Expand") : nullptr;
  Node* tile = reshape != nullptr && expand == nullptr ? ProducerWithOp(graph, reshape->input(0), "Tile") : nullptr;
  Node* repeat = expand != nullptr ? expand : tile;
  Node* unsqueeze = repeat != nullptr ? ProducerWithOp(graph, repeat->input(0), "Unsqueeze") : nullptr;
  if (unsqueeze == nullptr) return std::nullopt;
  std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, *unsqueeze);
  const std::string& kv = unsqueeze->input(0);
  if (!axes || *axes != std::vector<int64_t>{2} || shapes.Rank(kv) != 4) return std::nullopt;
  const std::string& sizes = repeat->input(1);
  const std::string& target = reshape->input(1);
  if (ShapeValueSize(graph, shapes, sizes) != 5u || ShapeValueSize(graph, shapes, target) != 4u) return std::nullopt;
  auto kv_count = ShapeValueElement(graph, shapes, sizes, 1);
  auto rep = ShapeValueElement(graph, shapes, sizes, 2);
  auto merged = ShapeValueElement(graph, shapes, target, 1);
  if (tile != nullptr) kv_count = shapes.DimValue(kv, 1);  // Tile's repeats: 1 on every axis but the new one
  if (!kv_count || !rep || !merged || *kv_count < 1 || *rep < 2 || *merged != *kv_count * *rep ||
      shapes.DimValue(kv, 1) != *kv_count) {
    return std::nullopt;
  }
  auto is_one = [&](size_t index) { return ShapeValueElement(graph, shapes, sizes, index) == 1; };
  const bool keeps = tile != nullptr ? is_one(0) && is_one(1) && is_one(3) && is_one(4)
                                     : KeepsDim(graph, shapes, sizes, 0, kv, 0) &&
                                           KeepsDim(graph, shapes, sizes, 3, kv, 2) &&
                                           KeepsDim(graph, shapes, sizes, 4, kv, 3);
  // The repeat keeps B, S and D; the Reshape merges only the KV and repeat axes.
  if (!keeps || !ElementIsDim(graph, shapes, target, 0, kv, 0) ||
      !ElementIsDim(graph, shapes, target, 2, kv, 2) || !ElementIsDim(graph, shapes, target, 3, kv, 3)) {
    return std::nullopt;
  }
  return KvRepeat{{unsqueeze, repeat, reshape}, kv, *kv_count, *rep};
}

// The past a cache Concat(past, new) on the sequence axis of [B,Nkv,*,D] starts from: a graph input,
// read directly or through an Identity or a one-input Concat (the TorchScript export of DynamicCache).
std::optional<std::string> CachedPast(const Graph& graph, const ShapeInfo& shapes, const Node& concat) {
  const int64_t axis = concat.GetAttributeInt("axis", 0);
  if (concat.input_size() != 2 || (axis != 2 && axis != -2)) return std::nullopt;
  std::string past = concat.input(0);
  for (int depth = 0; depth < 3 && !graph.IsGraphInput(past); ++depth) {
    Node* alias = graph.Producer(past);
    if (alias == nullptr || !alias->domain().empty() || alias->input_size() != 1 ||
        (alias->op_type() != "Identity" && alias->op_type() != "Concat")) {
      return std::nullopt;
    }
    past = alias->input(0);
  }
  if (!graph.IsGraphInput(past) || shapes.Rank(past) != 4) return std::nullopt;
  return past;
}

// K and V read from a key/value cache: both Concat(past, new), or neither. On a match `k_value` and
// `v_value` become the new K and V.
MatchResult<Matched> MatchKvCache(const Graph& graph, const ShapeInfo& shapes, std::string* k_value,
                                  std::string* v_value, AttentionMatch* match) {
  Node* k_concat = ProducerWithOp(graph, *k_value, "Concat");
  Node* v_concat = ProducerWithOp(graph, *v_value, "Concat");
  std::optional<std::string> past_key = k_concat ? CachedPast(graph, shapes, *k_concat) : std::nullopt;
  std::optional<std::string> past_value = v_concat ? CachedPast(graph, shapes, *v_concat) : std::nullopt;
  if (!past_key && !past_value) {
    // No past: the new K and V (or their repeat to the query heads) may be the presents themselves.
    std::vector<std::string> heads = {*k_value, *v_value};
    for (const auto* repeat : {&match->k_repeat, &match->v_repeat}) {
      if (repeat->has_value()) heads.push_back((*repeat)->nodes.back()->output(0));
    }
    for (const std::string& value : heads) {
      if (graph.IsGraphOutput(value)) match->fresh_presents.insert(value);
    }
    return Matched{};
  }
  if (!past_key || !past_value) return Fail("rotary attention: only one of K and V is read from a key/value cache");
  match->cache = KvCache{k_concat, v_concat, *past_key, *past_value};
  *k_value = k_concat->input(1);
  *v_value = v_concat->input(1);
  return Matched{};
}

// Which half of a stacked past [2,B,N,P,D] (a graph input) `value` is, 0 for the keys and 1 for the
// values: Squeeze(Split(past, axis 0)[i], [0]) or Gather(past, i, axis 0). The nodes on the way join `nodes`.
std::optional<std::pair<std::string, int>> StackedHalf(const Graph& graph, const ShapeInfo& shapes,
                                                       const std::string& value, std::vector<Node*>* nodes) {
  Node* producer = graph.Producer(value);
  if (producer == nullptr || !producer->domain().empty() || producer->input_size() < 1) return std::nullopt;
  std::optional<std::pair<std::string, int>> half;
  if (producer->op_type() == "Gather" && producer->input_size() == 2 && producer->GetAttributeInt("axis", 0) == 0) {
    const onnx::TensorProto* index = ConstantTensor(graph, producer->input(1));
    const auto ints = ConstantInts(graph, producer->input(1));
    if (index != nullptr && index->dims_size() == 0 && ints && ints->size() == 1 && ((*ints)[0] & ~1) == 0) {
      half = std::make_pair(producer->input(0), static_cast<int>((*ints)[0]));
      nodes->push_back(producer);
    }
  } else if (producer->op_type() == "Squeeze") {
    Node* split = ProducerWithOp(graph, producer->input(0), "Split");
    std::optional<std::vector<int64_t>> sizes;
    if (split != nullptr && split->input_size() > 1 && !split->input(1).empty()) {
      sizes = ConstantInts(graph, split->input(1));
    } else if (const onnx::AttributeProto* attribute = split != nullptr ? split->FindAttribute("split") : nullptr) {
      sizes = std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
    } else if (split != nullptr) {
      sizes = std::vector<int64_t>{1, 1};  // an even split (num_outputs 2 from opset 18) of the stacked axis
    }
    if (ConstantAxes(graph, *producer) == std::vector<int64_t>{0} && split != nullptr &&
        split->GetAttributeInt("axis", 0) == 0 && split->output_size() == 2 && sizes == std::vector<int64_t>{1, 1}) {
      half = std::make_pair(split->input(0), split->output(0) == producer->input(0) ? 0 : 1);
      nodes->insert(nodes->end(), {producer, split});
    }
  }
  if (!half || !graph.IsGraphInput(half->first) || shapes.Rank(half->first) != 5 ||
      shapes.DimValue(half->first, 0).value_or(2) != 2) {
    return std::nullopt;
  }
  return half;
}

// The present a stacked cache writes: Concat(Unsqueeze(keys, [0]), Unsqueeze(values, [0]), axis 0), a graph
// output, over the keys and values [B,N,T,D]; "" where the graph writes none. The nodes join `nodes`.
std::optional<std::string> StackedPresent(const Graph& graph, const std::string& keys, const std::string& values,
                                          std::vector<Node*>* nodes) {
  auto unsqueezed = [&](const std::string& value) -> Node* {
    for (Node* reader : graph.Consumers(value)) {
      if (reader->op_type() == "Unsqueeze" && reader->domain().empty() &&
          ConstantAxes(graph, *reader) == std::vector<int64_t>{0}) {
        return reader;
      }
    }
    return nullptr;
  };
  Node* k_unsqueeze = keys.empty() ? nullptr : unsqueezed(keys);
  Node* v_unsqueeze = unsqueezed(values);
  if (k_unsqueeze == nullptr && v_unsqueeze == nullptr) return std::string();
  Node* present = k_unsqueeze != nullptr ? SoleConsumer(graph, k_unsqueeze->output(0)) : nullptr;
  if (v_unsqueeze == nullptr || present == nullptr || present->op_type() != "Concat" || present->input_size() != 2 ||
      present->input(0) != k_unsqueeze->output(0) || present->input(1) != v_unsqueeze->output(0) ||
      present->GetAttributeInt("axis", 0) != 0 || !graph.IsGraphOutput(present->output(0))) {
    return std::nullopt;
  }
  nodes->insert(nodes->end(), {k_unsqueeze, v_unsqueeze, present});
  return present->output(0);
}

// The reader of `value` that is a Transpose with `perm`, or nullptr.
Node* TransposeReader(const Graph& graph, const std::string& value, const Perm& perm) {
  for (Node* reader : graph.Consumers(value)) {
    if (reader->op_type() == "Transpose" && reader->domain().empty() && PermOf(reader) == perm) return reader;
  }
  return nullptr;
}

// GPT-2's stacked cache (StackedCache) over Q, K and V head-split projections of one input, the keys in
// either layout: concatenated as [B,N,T,D] under the scores' K^T = Transpose(0,1,3,2) (transformers 4.x),
// or as K^T itself, Concat(Transpose(past_k, 0,1,3,2), K^T of the new keys, axis -1), stacked back
// transposed (transformers 3.x). Fail() without a reason where the block has no stacked cache.
MatchResult<Matched> MatchStackedCache(const Graph& graph, const ShapeInfo& shapes, AttentionMatch* match) {
  const Perm plain{0, 2, 1, 3}, swap_last{0, 1, 3, 2};
  StackedCache cache;
  Node* k_swap = ProducerWithOp(graph, match->scores.k_heads, "Transpose");
  Node* k_concat = nullptr;
  std::string past_keys, new_keys, keys;  // keys: [B,N,T,D], what the present stacks
  std::vector<Perm> new_key_perms = {plain};
  if (k_swap != nullptr && PermOf(k_swap) == swap_last) {
    k_concat = ProducerWithOp(graph, k_swap->input(0), "Concat");
    if (k_concat == nullptr || k_concat->input_size() != 2 ||
        (k_concat->GetAttributeInt("axis", 0) != 2 && k_concat->GetAttributeInt("axis", 0) != -2)) {
      return Fail();
    }
    past_keys = k_concat->input(0);
    keys = k_concat->output(0);
    cache.nodes.push_back(k_swap);
  } else {
    k_swap = nullptr;
    k_concat = ProducerWithOp(graph, match->scores.k_heads, "Concat");
    Node* past_swap = k_concat != nullptr && k_concat->input_size() == 2
                          ? ProducerWithOp(graph, k_concat->input(0), "Transpose") : nullptr;
    if (past_swap == nullptr || PermOf(past_swap) != swap_last ||
        (k_concat->GetAttributeInt("axis", 0) != 3 && k_concat->GetAttributeInt("axis", 0) != -1)) {
      return Fail();
    }
    past_keys = past_swap->input(0);
    cache.nodes.push_back(past_swap);
    new_key_perms = {{0, 2, 3, 1}};
    if (Node* back = TransposeReader(graph, k_concat->output(0), swap_last)) {
      keys = back->output(0);
      cache.nodes.push_back(back);
    }
  }
  new_keys = k_concat->input(1);
  Node* v_concat = ProducerWithOp(graph, match->out.matmul->input(1), "Concat");
  if (v_concat == nullptr || v_concat->input_size() != 2 ||
      (v_concat->GetAttributeInt("axis", 0) != 2 && v_concat->GetAttributeInt("axis", 0) != -2)) {
    return Fail();
  }
  const auto k_half = StackedHalf(graph, shapes, past_keys, &cache.nodes);
  const auto v_half = StackedHalf(graph, shapes, v_concat->input(0), &cache.nodes);
  if (!k_half || !v_half) return Fail();
  if (k_half->first != v_half->first || k_half->second != 0 || v_half->second != 1) {
    return Fail("a stacked past [2,B,N,P,D]: K and V are not its halves 0 and 1");
  }
  std::optional<std::string> present = StackedPresent(graph, keys, v_concat->output(0), &cache.nodes);
  if (!present) return Fail("a stacked past [2,B,N,P,D]: the present is not the keys and values stacked again");
  MatchResult<Projection> q = MatchProjection(graph, shapes, match->scores.q_heads, {plain});
  MatchResult<Projection> k = MatchProjection(graph, shapes, new_keys, new_key_perms);
  if (!k && k_swap == nullptr) k = MatchProjection(graph, shapes, new_keys, {plain, swap_last});
  MatchResult<Projection> v = MatchProjection(graph, shapes, v_concat->input(1), {plain});
  if (!q || !k || !v) return Fail("a stacked past [2,B,N,P,D]: Q, K and V are not head-split projections");
  cache.past = k_half->first;
  cache.present = *std::move(present);
  cache.nodes.insert(cache.nodes.end(), {k_concat, v_concat});
  std::set<Node*> seen;  // K and V share the Split
  cache.nodes.erase(std::remove_if(cache.nodes.begin(), cache.nodes.end(),
                                   [&](Node* node) { return !seen.insert(node).second; }),
                    cache.nodes.end());
  match->stacked_cache = std::move(cache);
  match->k_swap = k_swap;
  match->q = *std::move(q);
  match->k = *std::move(k);
  match->v = *std::move(v);
  return Matched{};
}

bool SameTables(const Rotation& a, const Rotation& b) {
  if (a.rotary_dim != b.rotary_dim) return false;
  return a.fused != nullptr ? b.fused != nullptr && a.position_ids == b.position_ids && a.cos_cache == b.cos_cache &&
                                  a.sin_cache == b.sin_cache
                            : b.fused == nullptr && a.cos == b.cos && a.sin == b.sin && a.table_rank == b.table_rank;
}

// Rotated Q and K (LLaMA): K^T = Transpose(0,1,3,2) of K rotated after its head split, possibly
// repeated to the query heads; V possibly repeated alike. Without match->q_rotation the same with
// nothing rotated: K repeated to the query heads (grouped-query attention without rotary embeddings).
MatchResult<Matched> MatchRotatedHeads(const Graph& graph, const ShapeInfo& shapes, AttentionMatch* match) {
  const Perm plain{0, 2, 1, 3};
  const bool rotated = match->q_rotation.has_value();
  Node* k_swap = ProducerWithOp(graph, match->scores.k_heads, "Transpose");
  std::string k_value = k_swap != nullptr && PermOf(k_swap) == Perm{0, 1, 3, 2} ? k_swap->input(0) : "";
  std::string v_value = match->out.matmul->input(1);
  if (!k_value.empty() && (match->k_repeat = MatchKvRepeat(graph, shapes, k_value))) k_value = match->k_repeat->kv_heads;
  if ((match->v_repeat = MatchKvRepeat(graph, shapes, v_value))) v_value = match->v_repeat->kv_heads;
  if (match->k_repeat.has_value() != match->v_repeat.has_value() ||
      (match->k_repeat && (match->k_repeat->rep != match->v_repeat->rep ||
                           match->k_repeat->kv_heads_count != match->v_repeat->kv_heads_count))) {
    return Fail("rotary attention: K and V are not repeated to the query heads alike (grouped-query attention)");
  }
  if (k_value.empty()) return Fail("rotary attention: K^T is not a transpose of the rotated K's last two axes");
  if (!match->k_repeat && MatchPath(graph, k_value, {{"Reshape"}, {"Expand"}})) {
    return Fail("rotary attention: K is repeated to the query heads (repeat_kv) in a form not recognized");
  }
  if (MatchResult<Matched> cache = MatchKvCache(graph, shapes, &k_value, &v_value, match); !cache) {
    return cache.failure();
  }
  if (!rotated && !match->k_repeat) return Fail("K^T is not K's head split transposed, nor repeated to the query heads");
  if (rotated) {
    if (MatchResult<Rotation> k_rotation = MatchRotation(graph, shapes, k_value)) match->k_rotation = *std::move(k_rotation);
    if (!match->k_rotation) return Fail("rotary attention: Q is rotated, K is not (in a form recognized)");
    if (!SameTables(*match->q_rotation, *match->k_rotation)) return Fail("rotary attention: Q and K rotate by other tables");
  }
  MatchResult<Projection> q =
      MatchProjection(graph, shapes, rotated ? match->q_rotation->heads : match->scores.q_heads, {plain});
  MatchResult<Projection> k = MatchProjection(graph, shapes, rotated ? match->k_rotation->heads : k_value, {plain});
  MatchResult<Projection> v = MatchProjection(graph, shapes, v_value, {plain});
  if (!q || !k || !v) return Fail("rotary attention: Q, K and V are not head-split projections");
  match->k_swap = k_swap;
  match->q = *std::move(q);
  match->k = *std::move(k);
  match->v = *std::move(v);
  return Matched{};
}

// The heads (N, D) a head-split Reshape shows: from its inferred output shape, else its constant
// target; the sequence-first [S, B*N, D] shows only D, and N = hidden / D.
std::optional<std::pair<int64_t, int64_t>> ShownHeads(const Graph& graph, const ShapeInfo& shapes, Layout layout,
                                                      const Node& reshape, int64_t hidden) {
  const std::string& heads = reshape.output(0);
  const auto target = ConstantInts(graph, reshape.input(1));
  if (layout == Layout::kBatchFirst) {
    auto n = shapes.DimValue(heads, 2), d = shapes.DimValue(heads, 3);
    if ((!n || !d) && target && target->size() == 4 && (*target)[2] > 0 && (*target)[3] > 0) {
      n = (*target)[2];
      d = (*target)[3];
    }
    if (n && d) return std::make_pair(*n, *d);
    return std::nullopt;
  }
  auto d = shapes.DimValue(heads, 2);
  if (!d && target && target->size() == 3 && (*target)[2] > 0) d = (*target)[2];
  if (d && *d > 0 && hidden % *d == 0) return std::make_pair(hidden / *d, *d);
  return std::nullopt;
}

}  // namespace

MatchResult<Projection> MatchProjection(const Graph& graph, const ShapeInfo& shapes, const std::string& head_value,
                                        const std::vector<Perm>& perms) {
  Projection projection;
  std::string value = head_value;
  for (auto it = perms.rbegin(); it != perms.rend(); ++it) {
    Node* transpose = ProducerWithOp(graph, value, "Transpose");
    if (transpose == nullptr || PermOf(transpose) != *it) return Fail();
    projection.transposes.push_back(transpose);
    value = transpose->input(0);
  }
  projection.head_norm = LastAxisNorm(graph, value);
  if (projection.head_norm != nullptr) value = projection.head_norm->input(0);
  projection.reshape = ProducerWithOp(graph, value, "Reshape");
  if (projection.reshape == nullptr) return Fail();
  std::string projected = projection.reshape->input(0);
  projection.projection_norm = LastAxisNorm(graph, projected);
  if (projection.projection_norm != nullptr) projected = projection.projection_norm->input(0);
  if (auto scaled = ScalarScale(graph, graph.Producer(projected))) {
    projection.scaling = graph.Producer(projected);
    projection.scale = scaled->first;
    projected = scaled->second;
  }
  if (MatchPackedPart(graph, shapes, projected, &projection)) projected = projection.part->input(0);
  // A LoRA branch added to the base projection (checked below to read the base's x).
  std::optional<std::string> lora_x;
  if (Node* add = ProducerWithOp(graph, projected, "Add")) {
    for (int i = 0; i < 2 && !lora_x; ++i) {
      if (std::optional<LoraBranch> branch = MatchLoraBranch(graph, add->input(i))) {
        lora_x = branch->x;
        projection.lora_add = add;
        projected = add->input(1 - i);
      }
    }
  }
  // Add(MatMul(x, W), b) with b on either side, or a MatMul without bias (T5, LLaMA, or one whose
  // zero bias the cleanups removed).
  if (std::optional<PathMatch> biased = MatchPath(graph, projected, {{"Add", kAnyInput}, {"MatMul"}})) {
    projection.add = biased->nodes[0];
    projection.matmul = biased->nodes[1];
    projection.bias = biased->Other(0);
  } else if (ProducerWithOp(graph, projected, "Add") == nullptr) {
    projection.matmul = ProducerWithOp(graph, projected, "MatMul");
  }
  if (projection.matmul == nullptr || (lora_x && *lora_x != projection.matmul->input(0))) return Fail();
  projection.x = projection.matmul->input(0);
  projection.weight = projection.matmul->input(1);
  return projection;
}

MatchResult<Matched> MatchHeads(const Graph& graph, const ShapeInfo& shapes, AttentionMatch* match) {
  const bool batch_first = match->layout == Layout::kBatchFirst;
  if (batch_first) {
    MatchResult<Rotation> rotation = MatchRotation(graph, shapes, match->scores.q_heads);
    if (rotation) {
      match->q_rotation = *std::move(rotation);
      return MatchRotatedHeads(graph, shapes, match);
    }
    if (!rotation.reason().empty()) return Fail(absl::StrCat("Q and K carry ", rotation.reason()));
  }
  const Perm plain = batch_first ? Perm{0, 2, 1, 3} : Perm{1, 0, 2};
  const Perm key = batch_first ? Perm{0, 2, 3, 1} : Perm{1, 2, 0};
  const Perm swap_last = batch_first ? Perm{0, 1, 3, 2} : Perm{0, 2, 1};
  MatchResult<Projection> q = MatchProjection(graph, shapes, match->scores.q_heads, {plain});
  MatchResult<Projection> v = MatchProjection(graph, shapes, match->out.matmul->input(1), {plain});
  MatchResult<Projection> k = MatchProjection(graph, shapes, match->scores.k_heads, {key});
  if (!k) k = MatchProjection(graph, shapes, match->scores.k_heads, {plain, swap_last});
  if (q && (!k || !v) && batch_first) {
    AttentionMatch grouped = *match;
    if (MatchRotatedHeads(graph, shapes, &grouped)) {
      *match = std::move(grouped);
      return Matched{};
    }
    if (MatchResult<Matched> stacked = MatchStackedCache(graph, shapes, match); stacked || !stacked.reason().empty()) {
      return stacked;
    }
  }
  if (!q || !k || !v) return Fail("Q, K and V are not head-split projections");
  match->q = *std::move(q);
  match->k = *std::move(k);
  match->v = *std::move(v);
  return Matched{};
}

MatchResult<Matched> MatchGivenHeads(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                     AttentionMatch* match, bool repeated_as_given) {
  if (match->layout != Layout::kBatchFirst) return Fail("the heads are sequence-first");
  Node* k_swap = ProducerWithOp(graph, match->scores.k_heads, "Transpose");
  // Without a swap of K's last two axes, K^T [B,N,D,T] is taken as given (DiT's pre-transposed keys);
  // no repeat or cache is looked for behind it.
  const bool keys_transposed = k_swap == nullptr || PermOf(k_swap) != Perm{0, 1, 3, 2};
  if (keys_transposed) k_swap = nullptr;
  std::string k_value = keys_transposed ? match->scores.k_heads : k_swap->input(0);
  std::string v_value = match->out.matmul->input(1);
  if (!repeated_as_given && !keys_transposed) {
    match->k_repeat = MatchKvRepeat(graph, shapes, k_value);
    match->v_repeat = MatchKvRepeat(graph, shapes, v_value);
  }
  if (match->k_repeat.has_value() != match->v_repeat.has_value() ||
      (match->k_repeat && (match->k_repeat->rep != match->v_repeat->rep ||
                           match->k_repeat->kv_heads_count != match->v_repeat->kv_heads_count))) {
    return Fail("K and V are not repeated to the query heads alike");
  }
  if (match->k_repeat) {
    k_value = match->k_repeat->kv_heads;
    v_value = match->v_repeat->kv_heads;
  }
  if (!repeated_as_given && !keys_transposed) {
    if (MatchResult<Matched> cache = MatchKvCache(graph, shapes, &k_value, &v_value, match); !cache) {
      return cache.failure();
    }
  }
  const std::string& q_value = match->scores.q_heads;
  for (const std::string& heads : {q_value, k_value, v_value}) {
    if (shapes.Rank(heads) != 4) return Fail("the heads are not known to be [B,N,S,D]");
  }
  const std::optional<int64_t> head_size = shapes.DimValue(q_value, 3);
  std::optional<int64_t> heads = shapes.DimValue(q_value, 1);
  if (!heads && context.hints().num_heads > 0) heads = context.hints().num_heads;
  if (!head_size || !heads || *head_size < 1 || *heads < 1) {
    return Fail("the heads' count or size is not known (set transformer.num_heads in the config)");
  }
  const int64_t rep = match->kv_repeat();
  for (const std::string* kv : {&k_value, &v_value}) {
    const std::optional<int64_t> kv_heads = shapes.DimValue(*kv, 1);
    const int head_axis = keys_transposed && kv == &k_value ? 2 : 3;
    if (shapes.DimValue(*kv, head_axis) != *head_size || (kv_heads && *kv_heads * rep != *heads) ||
        (!kv_heads && rep == 1 && !shapes.SameDim(*kv, 1, q_value, 1))) {
      return Fail("K and V are not known to have the query's head size and heads (after their repeat)");
    }
  }
  // Keys and values handed in as they are (an encoder's, projected once for every decoding step) go to the
  // operator in their own layout: merging them would copy them at every step.
  match->kv_in_heads_layout = !match->k_repeat && graph.IsGraphInput(k_value) && graph.IsGraphInput(v_value);
  match->k_swap = k_swap;
  match->q = Projection{};
  match->k = Projection{};
  match->v = Projection{};
  match->q.given_heads = q_value;
  match->k.given_heads = k_value;
  match->k.given_transposed = keys_transposed;
  match->v.given_heads = v_value;
  match->num_heads = *heads;
  match->head_size = *head_size;
  match->hidden = *heads * *head_size;
  return Matched{};
}

MatchResult<Matched> OverComputedHeads(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                       const std::string& reason, AttentionMatch* match) {
  match->q_rotation.reset();
  match->k_rotation.reset();
  match->k_repeat.reset();
  match->v_repeat.reset();
  match->cache.reset();
  if (MatchResult<Matched> given = MatchGivenHeads(graph, shapes, context, match, /*repeated_as_given=*/true); !given) {
    return Fail(absl::StrCat(reason, "; nor over the heads the graph computes: ", given.reason()));
  }
  match->kept_neighbour = reason;
  match->kv_in_heads_layout = true;
  return Matched{};
}

MatchResult<Matched> MatchHeadCounts(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                     AttentionMatch* match) {
  if (match->q.Given()) return Matched{};  // MatchGivenHeads counted them
  const int64_t hidden = match->hidden;
  if (auto shown = ShownHeads(graph, shapes, match->layout, *match->q.reshape, hidden)) {
    std::tie(match->num_heads, match->head_size) = *shown;
    if (match->num_heads * match->head_size != hidden) return Fail("the number of heads is unknown (set transformer.num_heads in the config)");
  } else if (const int64_t configured = context.hints().num_heads; configured > 0 && hidden % configured == 0) {
    match->num_heads = configured;
    match->head_size = hidden / configured;
  } else {
    return Fail("the number of heads is unknown (set transformer.num_heads in the config)");
  }
  // Every projection split into those heads (K and V into the key/value heads when repeated).
  if (match->NeedsProjectionsOutside()) {
    if (match->v_hidden > 0) return Fail("V's projection is another width than Q's and K's, beside what only MultiHeadAttention takes");
    const Rotation* q = match->q_rotation ? &*match->q_rotation : nullptr;
    if (q != nullptr && !q->Whole(match->head_size) && (q->fused == nullptr || q->rotary_dim > match->head_size)) {
      return Fail("rotary attention: a partial rotation only as RotaryEmbedding, within the head");
    }
    if (q != nullptr && q->fused == nullptr &&
        (2 * q->half != match->head_size || 2 * match->k_rotation->half != match->head_size)) {
      return Fail("rotary attention: the heads or the rotated half are not known to match");
    }
    return Matched{};
  }
  // V may be another width (qkv_hidden_sizes), split into as many heads.
  const int64_t v_width = match->OutputWidth();
  if (v_width % match->num_heads != 0) return Fail("V's width is not a multiple of the heads");
  for (const Projection* p : {&match->q, &match->k, &match->v}) {
    const int64_t width = p == &match->v ? v_width : hidden;
    if (ShownHeads(graph, shapes, match->layout, *p->reshape, width) !=
        std::make_pair(match->num_heads, width / match->num_heads)) {
      return Fail("Q, K and V are not split into the same heads");
    }
  }
  return Matched{};
}

}  // namespace onnxopt::attention
