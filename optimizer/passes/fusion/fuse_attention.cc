// fuse_attention: self-attention, as exporters write it, becomes ONNX Runtime's com.microsoft::Attention.
//
// Before (BERT, GPT-2; batch-first heads):
//   q = Reshape(Add(MatMul(x, Wq), bq), [B,S,N,D]) -> Transpose(0,2,1,3)
//   k = ... -> Transpose(0,2,3,1)   (or (0,2,1,3) then (0,1,3,2))
//   v = ... -> Transpose(0,2,1,3)
//   p = Softmax(masks(scale(MatMul(q, k))), axis=-1);  y = Reshape(Transpose(MatMul(p, v), (0,2,1,3)), [B,S,H])
// Before (torch.nn.MultiheadAttention, e.g. torchvision's ViT; sequence-first heads):
//   t = Transpose(x, (1,0,2)); qkv = Add(MatMul(t, W[H,3H]), b[3H]); q/k/v = three Slices of qkv
//   q = Transpose(Reshape(q, [S, B*N, D]), (1,0,2)) / sqrt(D); k -> Transpose(1,2,0); v -> Transpose(1,0,2)
//   c = Reshape(Transpose(MatMul(Softmax(MatMul(q, k)), v), (1,0,2)), [S*B, H]);
//   y = Transpose(Reshape(Gemm(c, Wo, bo, transB=1), [S,B,H]), (1,0,2))
// Before (LLaMA; rotary position embeddings after the head split):
//   q = rope(Transpose(Reshape(MatMul(x, Wq), [B,S,N,D]), (0,2,1,3)))  with rope(t) = t*cos + rotate_half(t)*sin
//   k = rope(...) -> Transpose(0,1,3,2);  v as BERT's;  scores + mask -> Softmax -> ... as above
// After:
//   y = Attention(x, [Wq|Wk|Wv], [bq|bk|bv], Cast(mask, int32), num_heads=N, scale, unidirectional,
//                 mask_filter_value)   (followed by MatMul(Wo^T) + bo for the sequence-first form)
//   LLaMA: y = MultiHeadAttention(Reshape(rope'(q4), [B,S,H]), Reshape(rope'(k4), [B,S,H]), x Wv,
//              attention_bias = the mask term)   rope' the same rotation on [B,S,N,D] (no transposes);
//   Attention needs the projections inside it, which the rotation sits between, so MultiHeadAttention
//   (projections outside) is the operator that fits; measured 1.04-1.17x over the original on CPU.
//
// Forms accepted: separate Q/K/V projections or one packed projection split by Split (sizes as input
// or attribute) or Slices; the scale as Div/Mul by a constant after Q*K or on Q (and/or K) before;
// masks: additive `(1 - mask[B,S]) * c` (c = -10000 or finfo.min), causal Where over a sliced
// lower-triangular buffer, in either order, and the boolean `Where(cond, 0, -inf or finfo.min)` that
// Hugging Face transformers 5 builds for its SDPA and eager paths, whatever its spelling: cond is
// probed in ONNX Runtime (attention_masks.h) and taken when it is all true (no mask: ViT), a
// key-padding mask of one [B, T] input (BERT, RoBERTa), causal, or causal with key padding (GPT-2). The SDPA path's NaN guard after Softmax,
// Where(IsNaN(p), 0, p), goes with the pattern: it only acts on rows that mask every position, where
// the original gives zeros and Attention the mean of V (padding-only sequences). Checked: one x; constant float weights; N and D from
// inferred shapes or constant Reshape targets (else the config's num_heads); exact permutations;
// Softmax on the last axis; every buffer element of a causal mask; the causal slice's shape equal to
// the scores'; and no reader outside the pattern but shape arithmetic feeding the pattern's own
// Reshapes, which goes with it. Attention's raw mask treats 0 as masked, so masks must hold 0/1.
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/canonical/attention_masks.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

using Perm = std::vector<int64_t>;

Perm PermOf(const Node* node) {
  const onnx::AttributeProto* perm = node == nullptr ? nullptr : node->FindAttribute("perm");
  return perm == nullptr ? Perm() : Perm(perm->ints().begin(), perm->ints().end());
}

// Heads laid out [B,N,S,D] (BERT, GPT-2) or [B*N,S,D] from a sequence-first [S,B,H] projection
// (torch.nn.MultiheadAttention).
enum class Layout { kBatchFirst, kSequenceFirst };

// One of Q, K, V: Add(MatMul(x, W), b) [-> part of a packed projection] -> Reshape -> Transposes.
struct Projection {
  Node* matmul = nullptr;
  Node* add = nullptr;
  Node* part = nullptr;  // packed Q/K/V: the Split or Slice taking this part
  int64_t offset = -1;   // packed: where this part starts in the packed projection's last axis
  int64_t size = -1;     // packed: its width
  Node* reshape = nullptr;
  std::vector<Node*> transposes;
  std::string x, weight, bias;  // bias empty: the projection has none
};

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
  if (producer->op_type() == "Slice" && producer->input_size() >= 4) {
    auto starts = ConstantInts(graph, producer->input(1));
    auto ends = ConstantInts(graph, producer->input(2));
    auto axes = ConstantInts(graph, producer->input(3));
    auto steps = producer->input_size() > 4 && !producer->input(4).empty() ? ConstantInts(graph, producer->input(4))
                                                                            : std::optional<std::vector<int64_t>>(std::vector<int64_t>{1});
    const auto width = shapes.DimValue(producer->input(0), -1);
    if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 || axes->size() != 1 ||
        *steps != std::vector<int64_t>{1} || !last_axis((*axes)[0]) || !width || (*starts)[0] < 0) {
      return false;
    }
    const int64_t end = std::min((*ends)[0], *width);
    if (end <= (*starts)[0]) return false;
    projection->part = producer;
    projection->offset = (*starts)[0];
    projection->size = end - (*starts)[0];
    return true;
  }
  return false;
}

// Follows `head_value` back through Transposes with the given perms (last first), a Reshape, an
// optional packed part and Add(MatMul(x, W), b).
bool MatchProjection(const Graph& graph, const ShapeInfo& shapes, const std::string& head_value,
                     const std::vector<Perm>& perms, Projection* projection) {
  std::string value = head_value;
  for (auto it = perms.rbegin(); it != perms.rend(); ++it) {
    Node* transpose = ProducerWithOp(graph, value, "Transpose");
    if (transpose == nullptr || PermOf(transpose) != *it) return false;
    projection->transposes.push_back(transpose);
    value = transpose->input(0);
  }
  projection->reshape = ProducerWithOp(graph, value, "Reshape");
  if (projection->reshape == nullptr) return false;
  std::string projected = projection->reshape->input(0);
  if (MatchPackedPart(graph, shapes, projected, projection)) projected = projection->part->input(0);
  projection->add = ProducerWithOp(graph, projected, "Add");
  if (projection->add == nullptr) {
    // A projection without bias (T5, LLaMA, or one whose zero bias the cleanups removed).
    projection->matmul = ProducerWithOp(graph, projected, "MatMul");
    if (projection->matmul == nullptr) return false;
    projection->x = projection->matmul->input(0);
    projection->weight = projection->matmul->input(1);
    return true;
  }
  for (int side = 0; side < 2; ++side) {
    Node* matmul = ProducerWithOp(graph, projection->add->input(side), "MatMul");
    if (matmul == nullptr) continue;
    projection->matmul = matmul;
    projection->bias = projection->add->input(1 - side);
    projection->x = matmul->input(0);
    projection->weight = matmul->input(1);
    return true;
  }
  return false;
}

bool MatchHeads(const Graph& graph, const ShapeInfo& shapes, Layout layout, const std::string& q_heads,
                const std::string& k_heads, const std::string& v_heads, Projection* q, Projection* k, Projection* v) {
  const Perm plain = layout == Layout::kBatchFirst ? Perm{0, 2, 1, 3} : Perm{1, 0, 2};
  const Perm key = layout == Layout::kBatchFirst ? Perm{0, 2, 3, 1} : Perm{1, 2, 0};
  const Perm swap_last = layout == Layout::kBatchFirst ? Perm{0, 1, 3, 2} : Perm{0, 2, 1};
  if (!MatchProjection(graph, shapes, q_heads, {plain}, q) || !MatchProjection(graph, shapes, v_heads, {plain}, v)) {
    return false;
  }
  if (MatchProjection(graph, shapes, k_heads, {key}, k)) return true;
  *k = Projection();
  return MatchProjection(graph, shapes, k_heads, {plain, swap_last}, k);
}

// True if `cond` is a lower-triangular (causal) buffer [1,1,P,P] sliced from 0 to the scores'
// [S, S] on its last two axes, as GPT-2 style models write `bias[:, :, :seq, :seq]`.
bool IsCausalSlice(const Graph& graph, const ShapeInfo& shapes, const std::string& cond, const std::string& scores) {
  std::string value = cond;
  std::set<int64_t> sliced_axes;
  // Either shape inference shows the slice is [.., S, S], or every end is the scores' dim.
  bool ends_match = true;
  for (int depth = 0; depth < 3; ++depth) {
    Node* slice = ProducerWithOp(graph, value, "Slice");
    if (slice == nullptr) break;
    if (slice->input_size() < 4) return false;
    auto starts = ConstantInts(graph, slice->input(1));
    auto axes = ConstantInts(graph, slice->input(3));
    auto steps = slice->input_size() > 4 && !slice->input(4).empty() ? ConstantInts(graph, slice->input(4))
                                                                      : std::optional<std::vector<int64_t>>(std::vector<int64_t>{1});
    if (!starts || !axes || !steps || starts->size() != axes->size()) return false;
    for (size_t i = 0; i < axes->size(); ++i) {
      const int64_t axis = (*axes)[i] < 0 ? (*axes)[i] + 4 : (*axes)[i];
      const int64_t step = steps->size() == 1 ? (*steps)[0] : (i < steps->size() ? (*steps)[i] : 0);
      if ((*starts)[i] != 0 || step != 1 || (axis != 2 && axis != 3)) return false;
      sliced_axes.insert(axis);
      ends_match &= ElementIsDim(graph, shapes, slice->input(2), i, scores, static_cast<int>(axis));
    }
    value = slice->input(0);
  }
  if (!ends_match && !(shapes.SameDim(cond, -1, scores, -1) && shapes.SameDim(cond, -2, scores, -2))) return false;
  const onnx::TensorProto* buffer = ConstantTensor(graph, value);
  if (buffer == nullptr || buffer->dims_size() != 4 || buffer->dims(0) != 1 || buffer->dims(1) != 1 ||
      buffer->dims(2) != buffer->dims(3) || sliced_axes != std::set<int64_t>{2, 3}) {
    return false;
  }
  const int64_t n = buffer->dims(2);
  std::vector<bool> on;
  if (buffer->data_type() == onnx::TensorProto::BOOL || buffer->data_type() == onnx::TensorProto::UINT8) {
    if (buffer->has_raw_data()) {
      for (char c : buffer->raw_data()) on.push_back(c != 0);
    } else {
      for (int32_t v : buffer->int32_data()) on.push_back(v != 0);
    }
  } else if (auto floats = TensorFloats(*buffer)) {
    for (float v : *floats) on.push_back(v != 0);
  }
  if (static_cast<int64_t>(on.size()) != n * n) return false;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (on[static_cast<size_t>(i * n + j)] != (j <= i)) return false;
    }
  }
  return true;
}

// What feeds the Softmax: Q*K^T, scaled, with an additive mask and/or a causal Where (either order).
struct Scores {
  Node* qk = nullptr;
  Node* post_scale = nullptr;              // Div/Mul after Q*K^T
  std::vector<Node*> pre_scales;           // Div/Mul on Q and/or K before it
  std::string q_heads, k_heads;            // Q*K^T's inputs before pre-scaling
  float scale = 1.0f;
  Node* causal_where = nullptr;
  Node* mask_add = nullptr;
  std::string mask_term;
};

// A Div or Mul by a scalar constant; its multiplier and the scaled input.
std::optional<std::pair<float, std::string>> ScalarScale(const Graph& graph, Node* node) {
  if (node == nullptr || !node->domain().empty() || node->input_size() != 2) return std::nullopt;
  if (node->op_type() == "Div") {
    auto c = ConstantScalarFloat(graph, node->input(1));
    if (c && *c != 0) return std::make_pair(1.0f / *c, node->input(0));
  } else if (node->op_type() == "Mul") {
    for (int side = 0; side < 2; ++side) {
      auto c = ConstantScalarFloat(graph, node->input(1 - side));
      if (c) return std::make_pair(*c, node->input(side));
    }
  }
  return std::nullopt;
}

// True if `value` is Q*K^T, possibly scaled or causally masked: the side of a mask Add that is not
// the mask.
bool LeadsToScores(const Graph& graph, const std::string& value, int depth = 0) {
  Node* producer = graph.Producer(value);
  if (producer == nullptr || !producer->domain().empty() || depth > 3) return false;
  if (producer->op_type() == "MatMul") return true;
  if (producer->op_type() == "Where") return LeadsToScores(graph, producer->input(1), depth + 1);
  if (auto scaled = ScalarScale(graph, producer)) return LeadsToScores(graph, scaled->second, depth + 1);
  return false;
}

bool MatchScores(const Graph& graph, const ShapeInfo& shapes, Node* softmax, Scores* scores, std::string* reason) {
  std::string value = softmax->input(0);
  for (int step = 0; step < 2; ++step) {
    if (Node* where = ProducerWithOp(graph, value, "Where"); where != nullptr && scores->causal_where == nullptr) {
      auto fill = ConstantScalarFloat(graph, where->input(2));
      if (!IsCausalSlice(graph, shapes, where->input(0), where->input(1)) || !fill || *fill > -1e4f) {
        *reason = "Where before Softmax is not a causal mask of the scores' [S, S]";
        return false;
      }
      scores->causal_where = where;
      value = where->input(1);
      continue;
    }
    Node* add = ProducerWithOp(graph, value, "Add");
    if (add == nullptr || scores->mask_add != nullptr) break;
    bool matched = false;
    for (int side = 0; side < 2 && !matched; ++side) {
      if (LeadsToScores(graph, add->input(side))) {
        scores->mask_add = add;
        scores->mask_term = add->input(1 - side);
        value = add->input(side);
        matched = true;
      }
    }
    if (!matched) return false;
  }
  if (auto post = ScalarScale(graph, graph.Producer(value))) {
    scores->post_scale = graph.Producer(value);
    scores->scale = post->first;
    value = post->second;
  }
  scores->qk = ProducerWithOp(graph, value, "MatMul");
  if (scores->qk == nullptr) return false;
  scores->q_heads = scores->qk->input(0);
  scores->k_heads = scores->qk->input(1);
  for (std::string* heads : {&scores->q_heads, &scores->k_heads}) {
    Node* producer = graph.Producer(*heads);
    if (auto pre = ScalarScale(graph, producer)) {
      scores->pre_scales.push_back(producer);
      scores->scale *= pre->first;
      *heads = pre->second;
    }
  }
  return true;
}

// Where the context goes after MatMul(probs, v), back to [B,S,H].
struct ContextOutput {
  Node* matmul = nullptr;               // MatMul(probs, v)
  std::vector<Node*> nodes;             // the merge (and for sequence-first: output projection) chain
  std::vector<Node*> reshapes;          // Reshapes among them (their shape inputs may be pattern arithmetic)
  std::string output;                   // the [B,S,H] value the fused node replaces
  bool flattened = false;               // batch-first: `output` is [B*S, H] (a Reshape follows the fused node)
  int64_t flat_width = 0;               // flattened: that H
  // Sequence-first only: the output projection, applied after the fused node.
  std::string out_weight, out_bias;
  bool out_weight_transposed = false;   // Gemm transB
};

// The one reader of `value` that is `op` reading it as its first input. Other readers (shape
// arithmetic) are allowed here; the pattern check decides about them.
Node* OnlyReader(const Graph& graph, const std::string& value, const char* op) {
  if (graph.IsGraphOutput(value)) return nullptr;
  Node* found = nullptr;
  for (Node* reader : graph.Consumers(value)) {
    if (reader->op_type() != op || !reader->domain().empty() || reader->input(0) != value) continue;
    if (found != nullptr) return nullptr;
    found = reader;
  }
  return found;
}

bool MatchContext(const Graph& graph, const ShapeInfo& shapes, Layout layout, Node* context_matmul, ContextOutput* out) {
  out->matmul = context_matmul;
  Node* transpose = OnlyReader(graph, context_matmul->output(0), "Transpose");
  if (transpose == nullptr) return false;
  out->nodes.push_back(transpose);
  if (layout == Layout::kBatchFirst) {
    if (PermOf(transpose) != Perm{0, 2, 1, 3}) return false;
    Node* reshape = OnlyReader(graph, transpose->output(0), "Reshape");
    if (reshape == nullptr) return false;
    const int rank = shapes.Rank(reshape->output(0)).value_or(0);
    // [B,S,H], or flattened to [B*S, H] for a Gemm (the dynamo export of GPT-2's Conv1D), which the
    // fused node's output is reshaped to again.
    auto target = ConstantInts(graph, reshape->input(1));
    out->flattened = rank == 2 && target && target->size() == 2 && (*target)[0] == -1 && (*target)[1] > 0;
    if (out->flattened) out->flat_width = (*target)[1];
    if (rank != 3 && !out->flattened) return false;
    out->nodes.push_back(reshape);
    out->reshapes.push_back(reshape);
    out->output = reshape->output(0);
    return true;
  }
  // [B*N,S,D] -> (1,0,2) -> [S,B*N,D] -> Reshape [S*B,H] or [S,B,H] -> projection -> [S,B,H] -> (1,0,2).
  if (PermOf(transpose) != Perm{1, 0, 2}) return false;
  Node* merge = OnlyReader(graph, transpose->output(0), "Reshape");
  if (merge == nullptr) return false;
  out->nodes.push_back(merge);
  out->reshapes.push_back(merge);
  const int merged_rank = shapes.Rank(merge->output(0)).value_or(0);
  std::string value = merge->output(0);
  Node* projection = OnlyReader(graph, value, "Gemm");
  if (projection == nullptr) projection = OnlyReader(graph, value, "MatMul");
  if (projection == nullptr) return false;
  if (projection->op_type() == "Gemm" && merged_rank == 2 && projection->GetAttributeInt("transA", 0) == 0 &&
      projection->GetAttributeFloat("alpha", 1.0f) == 1.0f && projection->GetAttributeFloat("beta", 1.0f) == 1.0f &&
      projection->input_size() == 3) {
    out->out_weight = projection->input(1);
    out->out_bias = projection->input(2);
    out->out_weight_transposed = projection->GetAttributeInt("transB", 0) != 0;
    out->nodes.push_back(projection);
    value = projection->output(0);
  } else if (projection->op_type() == "MatMul" && projection->input(0) == value) {
    Node* add = SoleConsumer(graph, projection->output(0));
    if (add == nullptr || add->op_type() != "Add" || !add->domain().empty()) return false;
    out->out_weight = projection->input(1);
    out->out_bias = add->input(0) == projection->output(0) ? add->input(1) : add->input(0);
    out->nodes.insert(out->nodes.end(), {projection, add});
    value = add->output(0);
  } else {
    return false;
  }
  if (merged_rank == 2) {
    Node* split = OnlyReader(graph, value, "Reshape");
    if (split == nullptr || shapes.Rank(split->output(0)).value_or(0) != 3) return false;
    out->nodes.push_back(split);
    out->reshapes.push_back(split);
    value = split->output(0);
  } else if (merged_rank != 3) {
    return false;
  }
  Node* back = OnlyReader(graph, value, "Transpose");
  if (back == nullptr || PermOf(back) != Perm{1, 0, 2}) return false;
  out->nodes.push_back(back);
  out->output = back->output(0);
  return true;
}

// The additive mask `(1 - Cast(Unsqueeze(mask[B,S], [1,2]))) * c`: the raw [B,S] mask and c.
bool MatchAdditiveMask(const Graph& graph, const ShapeInfo& shapes, const std::string& term, std::string* raw_mask,
                       float* filter, std::string* reason) {
  Node* mul = ProducerWithOp(graph, term, "Mul");
  Node* sub = nullptr;
  for (int side = 0; side < 2 && mul != nullptr && sub == nullptr; ++side) {
    auto c = ConstantScalarFloat(graph, mul->input(1 - side));
    Node* candidate = ProducerWithOp(graph, mul->input(side), "Sub");
    if (c && candidate != nullptr) {
      sub = candidate;
      *filter = *c;
    }
  }
  auto one = sub ? ConstantScalarFloat(graph, sub->input(0)) : std::nullopt;
  if (sub == nullptr || !one || *one != 1.0f || *filter > -1.0f) {
    *reason = "the mask is not in the (1 - mask) * c form";
    return false;
  }
  std::string value = sub->input(1);
  if (Node* cast = ProducerWithOp(graph, value, "Cast")) value = cast->input(0);
  Node* unsqueeze = ProducerWithOp(graph, value, "Unsqueeze");
  std::optional<std::vector<int64_t>> axes;
  if (unsqueeze != nullptr) {
    axes = unsqueeze->input_size() > 1 ? ConstantInts(graph, unsqueeze->input(1)) : std::nullopt;
    if (!axes) {
      const onnx::AttributeProto* attribute = unsqueeze->FindAttribute("axes");
      if (attribute != nullptr) axes = std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
    }
  }
  if (unsqueeze == nullptr || !axes || *axes != std::vector<int64_t>{1, 2} ||
      shapes.Rank(unsqueeze->input(0)).value_or(0) != 2) {
    *reason = "the mask is not a [B,S] mask unsqueezed to [B,1,1,S]";
    return false;
  }
  *raw_mask = unsqueeze->input(0);
  return true;
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

// N and D of the attention: what Q's split shows, else the configured number of heads.
bool HeadCounts(const Graph& graph, const ShapeInfo& shapes, const PassContext& context, Layout layout,
                const Projection& q, int64_t hidden, int64_t* num_heads, int64_t* head_size) {
  if (auto shown = ShownHeads(graph, shapes, layout, *q.reshape, hidden)) {
    std::tie(*num_heads, *head_size) = *shown;
    return *num_heads * *head_size == hidden;
  }
  const int64_t configured = context.hints().num_heads;
  if (configured > 0 && hidden % configured == 0) {
    *num_heads = configured;
    *head_size = hidden / configured;
    return true;
  }
  return false;
}

// The meaning of the boolean mask `cond`, probed once per pass run (masks are shared by layers).
const MaskMeaning& ProbeOnce(const Graph& graph, const PassContext& context, const std::string& cond,
                             std::map<std::string, MaskMeaning>* probed) {
  auto known = probed->find(cond);
  if (known == probed->end()) known = probed->emplace(cond, ProbeMaskMeaning(graph, context, cond)).first;
  return known->second;
}

// The boolean mask `Where(cond, 0, fill)` (fill -inf or below -1e4), as masking_utils writes it for
// SDPA and eager attention: what cond means is probed (attention_masks.h). All true: no mask at all.
// A key-padding mask of a [B, T] input: that input is Attention's raw mask. Causal (alone or with
// padding): unidirectional. -inf becomes the lowest float, which gives the same probabilities wherever
// a row keeps any position.
bool MatchBooleanMask(const Graph& graph, const PassContext& context, const std::string& term,
                      std::map<std::string, MaskMeaning>* probed, std::string* raw_mask, float* filter,
                      bool* causal, std::string* reason) {
  Node* where = ProducerWithOp(graph, term, "Where");
  auto zero = where ? ConstantScalarFloat(graph, where->input(1)) : std::nullopt;
  auto fill = where ? ConstantScalarFloat(graph, where->input(2)) : std::nullopt;
  if (where == nullptr || !zero || *zero != 0.0f || !fill || !(*fill <= -1e4f)) return false;
  const MaskMeaning& meaning = ProbeOnce(graph, context, where->input(0), probed);
  switch (meaning.kind) {
    case MaskMeaning::Kind::kAllTrue:  // raw_mask stays empty: no mask input
      return true;
    case MaskMeaning::Kind::kCausal:
      *causal = true;
      return true;
    case MaskMeaning::Kind::kCausalKeyPadding:
      *causal = true;
      [[fallthrough]];
    case MaskMeaning::Kind::kKeyPadding:
      *raw_mask = meaning.padding_input;
      *filter = std::isinf(*fill) ? std::numeric_limits<float>::lowest() : *fill;
      return true;
    case MaskMeaning::Kind::kUnknown:
      *reason = absl::StrCat("the boolean mask is not understood: ", meaning.why);
      return false;
  }
  return false;
}

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
  std::optional<std::vector<int64_t>> axes;
  if (unsqueeze->input_size() > 1) {
    axes = ConstantInts(graph, unsqueeze->input(1));
  } else if (const onnx::AttributeProto* attribute = unsqueeze->FindAttribute("axes")) {
    axes = std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
  }
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

// True if `term` can be ONNX Runtime's attention_bias for these scores: [B|1, N|1, S, T] with the
// scores' S and T (only the first two axes broadcast there).
bool FitsAttentionBias(const ShapeInfo& shapes, const std::string& term, const std::string& scores, int64_t heads) {
  if (shapes.Rank(term).value_or(0) != 4 || !shapes.SameDim(term, -1, scores, -1) || !shapes.SameDim(term, -2, scores, -2)) {
    return false;
  }
  const auto batch = shapes.DimValue(term, 0), head = shapes.DimValue(term, 1);
  return (!batch || *batch == 1 || shapes.SameDim(term, 0, scores, 0)) &&
         ((head && (*head == 1 || *head == heads)) || shapes.SameDim(term, 1, scores, 1));
}

// The guard transformers puts after Softmax for rows that mask every position: Where(IsNaN(p), 0, p).
// Attention's finite mask value never makes such rows NaN, so the guard goes with the pattern.
std::vector<Node*> MatchNanGuard(const Graph& graph, Node* softmax) {
  const std::string& probs = softmax->output(0);
  std::vector<Node*> readers = graph.Consumers(probs);
  if (readers.size() != 2 || graph.IsGraphOutput(probs)) return {};
  Node* is_nan = readers[0]->op_type() == "IsNaN" ? readers[0] : readers[1];
  Node* where = is_nan == readers[0] ? readers[1] : readers[0];
  auto zero = ConstantScalarFloat(graph, where->input_size() == 3 ? where->input(1) : "");
  if (is_nan->op_type() != "IsNaN" || where->op_type() != "Where" || !is_nan->domain().empty() ||
      !where->domain().empty() || where->input(0) != is_nan->output(0) || where->input(2) != probs || !zero ||
      *zero != 0.0f || SoleConsumer(graph, is_nan->output(0)) != where) {
    return {};
  }
  return {is_nan, where};
}

// True if everything `node` computes reaches only shape inputs (not input 0) of the `targets` (the
// pattern's Reshapes and causal-mask Slices): shape arithmetic, and nodes such as the unused
// Transpose an exporter keeps only to read its shape. Collects the nodes on the way.
bool FeedsOnlyShapeInputs(const Graph& graph, Node* node, const std::set<Node*>& targets,
                          std::vector<Node*>* collected, int depth = 0) {
  if (depth > 10 || !node->domain().empty() || !node->subgraphs().empty()) return false;
  for (const std::string& output : node->proto().output()) {
    if (output.empty()) continue;
    if (graph.IsGraphOutput(output)) return false;
    for (Node* reader : graph.Consumers(output)) {
      if (targets.count(reader) > 0 && reader->input(0) != output) continue;
      if (!FeedsOnlyShapeInputs(graph, reader, targets, collected, depth + 1)) return false;
    }
  }
  collected->push_back(node);
  return true;
}

// True if every value the pattern computes, but `output`, is read only by pattern members or by shape
// arithmetic that feeds the `targets`' shape inputs (collected into shape_nodes, to go too).
bool OnlyReadInside(const Graph& graph, const std::vector<Node*>& pattern, const std::set<Node*>& members,
                    const std::set<Node*>& targets, const std::string& output, std::vector<Node*>* shape_nodes,
                    std::string* reason) {
  for (Node* node : pattern) {
    for (const std::string& value : node->proto().output()) {
      if (value.empty() || value == output) continue;
      if (graph.IsGraphOutput(value)) {
        *reason = "an intermediate value is a graph output";
        return false;
      }
      for (Node* reader : graph.Consumers(value)) {
        if (members.count(reader) > 0) continue;
        if (!FeedsOnlyShapeInputs(graph, reader, targets, shape_nodes)) {
          *reason = absl::StrCat("an intermediate value (", node->op_type(), " output) is read outside the pattern by ",
                                 reader->op_type());
          return false;
        }
      }
    }
  }
  return true;
}

// After a fused node writing `attended` [B,S,H]: Reshape it to `output` [B*S, H] for the Gemm that read
// the flattened context.
void AddFlatten(Graph& graph, const std::string& attended, const std::string& output, int64_t hidden, const Node* after) {
  const std::string flat_shape = graph.UniqueName(output + "_flat_shape");
  graph.AddInitializer(MakeInt64Tensor(flat_shape, {-1, hidden}));
  onnx::NodeProto flatten;
  flatten.set_op_type("Reshape");
  flatten.set_name(graph.UniqueName("attention_flatten"));
  flatten.add_input(attended);
  flatten.add_input(flat_shape);
  flatten.add_output(output);
  graph.AddNode(std::move(flatten), after, /*after=*/true);
}

// The Slices that cut the causal mask out of its buffer, nearest first.
std::vector<Node*> CausalSlices(const Graph& graph, const std::string& cond) {
  std::vector<Node*> slices;
  for (Node* slice = ProducerWithOp(graph, cond, "Slice"); slice != nullptr && slices.size() < 3;
       slice = ProducerWithOp(graph, slice->input(0), "Slice")) {
    slices.push_back(slice);
  }
  return slices;
}

class FuseAttentionPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_attention"; }
  absl::string_view description() const override {
    return "Fuse self-attention (BERT/GPT-2 style and torch.nn.MultiheadAttention; separate or packed Q/K/V, "
           "additive and causal masks) into ONNX Runtime's Attention";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    std::unordered_map<std::string, std::string> int32_masks;  // raw mask -> its int32 Cast
    std::map<std::string, MaskMeaning> probed;                   // boolean mask -> what it means
    for (Node* softmax : graph.Nodes()) {
      if (softmax->removed() || softmax->op_type() != "Softmax" || !softmax->domain().empty()) continue;
      std::string reason;
      if (!TryFuse(graph, softmax, *shapes, context, &int32_masks, &probed, &reason) && !reason.empty()) {
        context.Skip(absl::StrCat("fuse_attention: ", reason));
      }
    }
    return absl::OkStatus();
  }

 private:
  // LLaMA-style attention, Q and K rotated after the head split, into MultiHeadAttention:
  //   q4 = Reshape(x Wq, [B,S,N,D]); q = Transpose(q4) * cos + rotate_half(Transpose(q4)) * sin; ...
  // becomes the same rotation on q4 itself (cos/sin unsqueezed on the head axis instead), then
  //   MultiHeadAttention(Reshape(q4_rotated, [B,S,H]), Reshape(k4_rotated, [B,S,H]), x Wv, attention_bias)
  // The projections stay as they are; the mask term becomes attention_bias (-inf as the lowest float).
  static bool TryFuseRotary(Graph& graph, Node* softmax, const ShapeInfo& shapes, PassContext& context,
                            const Scores& scores, const std::vector<Node*>& nan_guard, Node* context_matmul,
                            const ContextOutput& out, std::map<std::string, MaskMeaning>* probed,
                            std::string* reason) {
    const Perm plain{0, 2, 1, 3};
    Node* k_swap = ProducerWithOp(graph, scores.k_heads, "Transpose");
    auto q_rotary = MatchRotary(graph, scores.q_heads);
    auto k_rotary = k_swap != nullptr && PermOf(k_swap) == Perm{0, 1, 3, 2} ? MatchRotary(graph, k_swap->input(0))
                                                                            : std::nullopt;
    Projection q, k, v;
    if (!q_rotary || !k_rotary || q_rotary->cos != k_rotary->cos || q_rotary->sin != k_rotary->sin ||
        !MatchProjection(graph, shapes, q_rotary->heads, {plain}, &q) ||
        !MatchProjection(graph, shapes, k_rotary->heads, {plain}, &k) ||
        !MatchProjection(graph, shapes, context_matmul->input(1), {plain}, &v)) {
      *reason = "Q and K carry rotary position embeddings in a form not recognized";
      return false;
    }
    const onnx::TensorProto* q_weight = ConstantTensor(graph, q.weight);
    const onnx::TensorProto* k_weight = ConstantTensor(graph, k.weight);
    const onnx::TensorProto* v_weight = ConstantTensor(graph, v.weight);
    if (q_weight == nullptr || k_weight == nullptr || v_weight == nullptr || q_weight->dims_size() != 2 ||
        k_weight->dims_size() != 2 || v_weight->dims_size() != 2 || q.part != nullptr) {
      *reason = "rotary attention: projection weights are not constant [in, out] matrices";
      return false;
    }
    const int64_t hidden = q_weight->dims(1);
    if (k_weight->dims(1) != hidden || v_weight->dims(1) != hidden) {
      *reason = "rotary attention: fewer key/value heads than query heads (grouped-query attention), not fused yet";
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
    // The mask term: a boolean Where becomes a float bias with a finite fill; another float term as is.
    std::string bias_cond;
    std::string bias = scores.mask_add != nullptr ? scores.mask_term : "";
    if (!bias.empty()) {
      Node* where = ProducerWithOp(graph, bias, "Where");
      auto zero = where ? ConstantScalarFloat(graph, where->input(1)) : std::nullopt;
      auto fill = where ? ConstantScalarFloat(graph, where->input(2)) : std::nullopt;
      const bool boolean = zero && *zero == 0.0f && fill && *fill <= -1e4f;
      bool fits = FitsAttentionBias(shapes, bias, softmax->input(0), num_heads);
      if (boolean && !fits) {  // shapes unknown (opset 20): the probe saw [B|1, 1, L, L] at every length
        const MaskMeaning& meaning = ProbeOnce(graph, context, where->input(0), probed);
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
    const std::set<Node*> members(pattern.begin(), pattern.end());
    const std::set<Node*> targets(out.reshapes.begin(), out.reshapes.end());
    std::vector<Node*> shape_nodes;
    if (!OnlyReadInside(graph, pattern, members, targets, out.output, &shape_nodes, reason)) {
      *reason = absl::StrCat("rotary attention: ", *reason);
      return false;
    }

    // Rewrite: the rotation on [B,S,N,D], flattened heads, MultiHeadAttention.
    Node* anchor = out.nodes.back();
    for (Node* node : pattern) graph.RemoveNode(node);
    for (Node* node : shape_nodes) {
      if (!node->removed()) graph.RemoveNode(node);
    }
    const Node* at = anchor;
    auto add_node = [&](const std::string& op, std::vector<std::string> inputs, const std::string& hint,
                        std::vector<onnx::AttributeProto> attributes = {}) {
      onnx::NodeProto node;
      node.set_op_type(op);
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
      const std::string rotated_half = add_node("Concat", {negated, low}, hint + "_rotate_half", {IntAttribute("axis", -1)});
      const std::string with_cos = add_node("Mul", {x, cos}, hint + "_cos");
      const std::string with_sin = add_node("Mul", {rotated_half, sin}, hint + "_sin");
      const std::string rotated = add_node("Add", {with_cos, with_sin}, hint + "_rotated");
      return add_node("Reshape", {rotated, flat}, hint + "_flat");
    };
    const std::string query = rotate(q, "rotary_q");
    const std::string key = rotate(k, "rotary_k");
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
    for (const std::string& input : {query, key, v.reshape->input(0)}) mha.add_input(input);
    if (!attention_bias.empty()) {
      for (int i = 0; i < 2; ++i) mha.add_input("");  // bias, key_padding_mask
      mha.add_input(attention_bias);
    }
    const std::string attended = out.flattened ? graph.UniqueName(out.output + "_attention") : out.output;
    mha.add_output(attended);
    *mha.add_attribute() = IntAttribute("num_heads", num_heads);
    *mha.add_attribute() = FloatAttribute("scale", scores.scale);
    at = graph.AddNode(std::move(mha), at, /*after=*/true);
    if (out.flattened) AddFlatten(graph, attended, out.output, hidden, at);
    context.RequireOpset("com.microsoft", 1);
    context.CountRewrite();
    return true;
  }

  static bool TryFuse(Graph& graph, Node* softmax, const ShapeInfo& shapes, PassContext& context,
                      std::unordered_map<std::string, std::string>* int32_masks,
                      std::map<std::string, MaskMeaning>* probed, std::string* reason) {
    const auto rank = shapes.Rank(softmax->input(0));
    // Before opset 13 Softmax defaults to axis 1 (over everything after it, flattened).
    const int64_t axis = softmax->GetAttributeInt("axis", context.OpsetVersion("") < 13 ? 1 : -1);
    if (!rank || (*rank != 4 && *rank != 3) || (axis != -1 && axis != *rank - 1)) return false;
    const Layout layout = *rank == 4 ? Layout::kBatchFirst : Layout::kSequenceFirst;
    Scores scores;
    if (!MatchScores(graph, shapes, softmax, &scores, reason)) return false;
    const std::vector<Node*> nan_guard = MatchNanGuard(graph, softmax);
    const std::string probs = nan_guard.empty() ? softmax->output(0) : nan_guard.back()->output(0);
    Node* context_matmul = SoleConsumer(graph, probs);
    if (context_matmul == nullptr || context_matmul->op_type() != "MatMul" || context_matmul->input(0) != probs) {
      return false;
    }
    ContextOutput out;
    if (!MatchContext(graph, shapes, layout, context_matmul, &out)) {
      *reason = "the context is not merged back to [B,S,H]";
      return false;
    }
    Projection q, k, v;
    if (!MatchHeads(graph, shapes, layout, scores.q_heads, scores.k_heads, context_matmul->input(1), &q, &k, &v)) {
      if (layout == Layout::kBatchFirst && HasRotaryEmbedding(graph, scores.q_heads)) {
        return TryFuseRotary(graph, softmax, shapes, context, scores, nan_guard, context_matmul, out, probed, reason);
      }
      *reason = "Q, K and V are not head-split projections";
      return false;
    }
    if (q.x != k.x || q.x != v.x) {
      *reason = "Q, K and V are not projections of one input";
      return false;
    }
    // The attention input: x itself, or for the sequence-first form the batch-first tensor it transposes.
    std::string input = q.x;
    Node* input_transpose = nullptr;
    if (layout == Layout::kSequenceFirst) {
      input_transpose = ProducerWithOp(graph, q.x, "Transpose");
      if (input_transpose == nullptr || PermOf(input_transpose) != Perm{1, 0, 2}) {
        *reason = "the sequence-first projections do not read a transposed batch-first input";
        return false;
      }
      input = input_transpose->input(0);
    }
    if (shapes.Rank(input).value_or(0) != 3) {
      *reason = "the attention input is not known to be 3-D";
      return false;
    }

    // Weights: one packed projection (Q|K|V parts in order) or three separate ones.
    const bool packed = q.part != nullptr;
    const onnx::TensorProto* q_weight = ConstantTensor(graph, q.weight);
    if (q_weight == nullptr || q_weight->dims_size() != 2) {
      *reason = "projection weights are not constant";
      return false;
    }
    const int64_t input_hidden = q_weight->dims(0);
    int64_t hidden = 0;
    std::vector<float> weights[3], biases[3];
    const Projection* projections[3] = {&q, &k, &v};
    if (packed) {
      const onnx::TensorProto* b = q.bias.empty() ? nullptr : ConstantTensor(graph, q.bias);
      hidden = q.size;
      const bool bias_ok = q.bias.empty() || (b != nullptr && b->dims_size() == 1 && b->dims(0) == 3 * hidden &&
                                              TensorFloats(*b));
      if (k.matmul != q.matmul || v.matmul != q.matmul || k.add != q.add || v.add != q.add || q.offset != 0 ||
          k.offset != hidden ||
          v.offset != 2 * hidden || k.size != hidden || v.size != hidden || q_weight->dims(1) != 3 * hidden ||
          !bias_ok || !TensorFloats(*q_weight)) {
        *reason = "the packed Q/K/V projection is not split into three equal float parts in order";
        return false;
      }
    } else {
      hidden = q_weight->dims(1);
      for (int i = 0; i < 3; ++i) {
        const onnx::TensorProto* w = ConstantTensor(graph, projections[i]->weight);
        auto wf = w ? TensorFloats(*w) : std::nullopt;
        auto bf = projections[i]->bias.empty() ? std::optional<std::vector<float>>(std::vector<float>(
                                                      static_cast<size_t>(w ? w->dims(w->dims_size() - 1) : 0), 0.0f))
                                                : ConstantFloats(graph, projections[i]->bias);
        if (!wf || !bf || w->dims_size() != 2 || w->dims(0) != input_hidden || w->dims(1) != hidden ||
            bf->size() != static_cast<size_t>(hidden)) {
          *reason = "projection weights are not float constants of one width";
          return false;
        }
        weights[i] = *std::move(wf);
        biases[i] = *std::move(bf);
      }
    }
    if (out.flattened && out.flat_width != hidden) {
      *reason = "the context is flattened to another width than the attention's";
      return false;
    }
    int64_t num_heads = 0, head_size = 0;
    if (!HeadCounts(graph, shapes, context, layout, q, hidden, &num_heads, &head_size)) {
      *reason = "the number of heads is unknown (set transformer.num_heads in the config)";
      return false;
    }
    for (const Projection* p : projections) {
      if (ShownHeads(graph, shapes, layout, *p->reshape, hidden) != std::make_pair(num_heads, head_size)) {
        *reason = "Q, K and V are not split into the same heads";
        return false;
      }
    }
    // Output projection of the sequence-first form, as a [H, H] float constant.
    std::vector<float> out_weight;
    if (layout == Layout::kSequenceFirst) {
      const onnx::TensorProto* w = ConstantTensor(graph, out.out_weight);
      auto wf = w ? TensorFloats(*w) : std::nullopt;
      auto bf = ConstantFloats(graph, out.out_bias);
      if (!wf || !bf || w->dims_size() != 2 || w->dims(0) != hidden || w->dims(1) != hidden ||
          bf->size() != static_cast<size_t>(hidden)) {
        *reason = "the output projection is not a float constant [H, H]";
        return false;
      }
      out_weight = *std::move(wf);
    }

    std::string raw_mask;
    float mask_filter = -10000.0f;
    bool causal = scores.causal_where != nullptr;
    std::string attention_bias;
    if (scores.mask_add != nullptr) {
      std::string boolean_reason, additive_reason;
      if (!MatchBooleanMask(graph, context, scores.mask_term, probed, &raw_mask, &mask_filter, &causal,
                            &boolean_reason) &&
          !MatchAdditiveMask(graph, shapes, scores.mask_term, &raw_mask, &mask_filter, &additive_reason)) {
        // Any other float term added to the scores (T5's relative position bias plus its mask) is
        // Attention's attention_bias, when it is [B or 1, N or 1, S, T] with the scores' S and T.
        const std::string& term = scores.mask_term;
        const bool biased = boolean_reason.empty() && shapes.ElementType(term) == onnx::TensorProto::FLOAT &&
                            FitsAttentionBias(shapes, term, softmax->input(0), num_heads);
        if (!biased) {
          *reason = !boolean_reason.empty() ? boolean_reason
                                            : absl::StrCat(additive_reason, ", nor a [B|1, N|1, S, T] float bias");
          return false;
        }
        attention_bias = term;
      }
    }

    // Every intermediate is read only inside the pattern, or by shape arithmetic that feeds the
    // pattern's own Reshapes.
    std::vector<Node*> pattern = {softmax, scores.qk, context_matmul};
    pattern.insert(pattern.end(), nan_guard.begin(), nan_guard.end());
    pattern.insert(pattern.end(), out.nodes.begin(), out.nodes.end());
    pattern.insert(pattern.end(), scores.pre_scales.begin(), scores.pre_scales.end());
    for (Node* node : {scores.post_scale, scores.mask_add, scores.causal_where, input_transpose}) {
      if (node != nullptr) pattern.push_back(node);
    }
    std::set<Node*> members;
    for (const Projection* p : projections) {
      for (Node* node : {p->matmul, p->add, p->part, p->reshape}) {
        if (node != nullptr && members.insert(node).second) pattern.push_back(node);
      }
      pattern.insert(pattern.end(), p->transposes.begin(), p->transposes.end());
    }
    members.insert(pattern.begin(), pattern.end());
    std::set<Node*> targets = {q.reshape, k.reshape, v.reshape};
    targets.insert(out.reshapes.begin(), out.reshapes.end());
    // The causal mask's Slices go too when nothing else reads them (layers may share one after CSE).
    if (scores.causal_where != nullptr) {
      for (Node* slice : CausalSlices(graph, scores.causal_where->input(0))) {
        bool only_pattern = !graph.IsGraphOutput(slice->output(0));
        for (Node* reader : graph.Consumers(slice->output(0))) only_pattern &= members.count(reader) > 0;
        if (!only_pattern) break;
        pattern.push_back(slice);
        members.insert(slice);
        targets.insert(slice);
      }
    }
    std::vector<Node*> shape_nodes;
    if (!OnlyReadInside(graph, pattern, members, targets, out.output, &shape_nodes, reason)) return false;

    // Rewrite.
    std::string w_name = q.weight, b_name = q.bias;
    if (packed && q.bias.empty()) {  // Attention takes a bias: zeros
      b_name = graph.UniqueName("attention_qkv_bias");
      graph.AddInitializer(MakeFloatTensor(b_name, {3 * hidden}, std::vector<float>(static_cast<size_t>(3 * hidden), 0.0f)));
    }
    if (!packed) {
      std::vector<float> packed_weight(static_cast<size_t>(input_hidden * 3 * hidden));
      for (int64_t row = 0; row < input_hidden; ++row) {
        for (int i = 0; i < 3; ++i) {
          std::copy(weights[i].begin() + row * hidden, weights[i].begin() + (row + 1) * hidden,
                    packed_weight.begin() + row * 3 * hidden + i * hidden);
        }
      }
      std::vector<float> packed_bias;
      for (int i = 0; i < 3; ++i) packed_bias.insert(packed_bias.end(), biases[i].begin(), biases[i].end());
      w_name = graph.UniqueName("attention_qkv_weight");
      b_name = graph.UniqueName("attention_qkv_bias");
      graph.AddInitializer(MakeFloatTensor(w_name, {input_hidden, 3 * hidden}, packed_weight));
      graph.AddInitializer(MakeFloatTensor(b_name, {3 * hidden}, packed_bias));
    }
    onnx::NodeProto attention;
    attention.set_op_type("Attention");
    attention.set_domain("com.microsoft");
    attention.set_name(graph.UniqueName("Attention"));
    for (const std::string& name : {input, w_name, b_name}) attention.add_input(name);
    if (!raw_mask.empty()) {
      auto known = int32_masks->find(raw_mask);
      if (known == int32_masks->end()) {
        known = int32_masks->emplace(raw_mask, AddCast(graph, raw_mask, onnx::TensorProto::INT32, q.matmul)).first;
      }
      attention.add_input(known->second);
    }
    const std::string attended = layout == Layout::kBatchFirst && !out.flattened
                                     ? out.output
                                     : graph.UniqueName(out.output + "_attention");
    if (!attention_bias.empty()) {
      if (raw_mask.empty()) attention.add_input("");  // mask_index
      attention.add_input("");                       // past
      attention.add_input(attention_bias);           // attention_bias
    }
    attention.add_output(attended);
    *attention.add_attribute() = IntAttribute("num_heads", num_heads);
    if (causal) *attention.add_attribute() = IntAttribute("unidirectional", 1);
    if (!raw_mask.empty()) *attention.add_attribute() = FloatAttribute("mask_filter_value", mask_filter);
    if (std::fabs(scores.scale * std::sqrt(static_cast<float>(head_size)) - 1.0f) > 1e-6f) {
      *attention.add_attribute() = FloatAttribute("scale", scores.scale);
    }
    Node* anchor = out.nodes.back();
    for (Node* node : pattern) graph.RemoveNode(node);
    for (Node* node : shape_nodes) {
      if (!node->removed()) graph.RemoveNode(node);
    }
    Node* fused = graph.AddNode(std::move(attention), anchor, /*after=*/true);
    if (out.flattened) AddFlatten(graph, attended, out.output, hidden, fused);
    if (layout == Layout::kSequenceFirst) {
      // The output projection, row-wise, now on the batch-first result: MatMul(W [H_in, H_out]) + b.
      std::string weight = out.out_weight;
      if (out.out_weight_transposed) {
        std::vector<float> transposed(out_weight.size());
        for (int64_t row = 0; row < hidden; ++row) {
          for (int64_t col = 0; col < hidden; ++col) transposed[col * hidden + row] = out_weight[row * hidden + col];
        }
        weight = graph.UniqueName(out.out_weight + "_transposed");
        graph.AddInitializer(MakeFloatTensor(weight, {hidden, hidden}, transposed));
      }
      onnx::NodeProto matmul;
      matmul.set_op_type("MatMul");
      matmul.set_name(graph.UniqueName("attention_output_projection"));
      const std::string projected = graph.UniqueName(out.output + "_projected");
      matmul.add_input(attended);
      matmul.add_input(weight);
      matmul.add_output(projected);
      Node* added = graph.AddNode(std::move(matmul), fused, /*after=*/true);
      onnx::NodeProto add;
      add.set_op_type("Add");
      add.set_name(graph.UniqueName("attention_output_bias"));
      add.add_input(projected);
      add.add_input(out.out_bias);
      add.add_output(out.output);
      graph.AddNode(std::move(add), added, /*after=*/true);
    }
    context.RequireOpset("com.microsoft", 1);
    context.CountRewrite();
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseAttentionPass() { return std::make_unique<FuseAttentionPass>(); }

}  // namespace onnxopt
