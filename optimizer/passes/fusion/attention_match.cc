// Matchers shared by the attention fusions: see attention_match.h.
#include "optimizer/passes/fusion/attention_match.h"

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt::attention {


Perm PermOf(const Node* node) {
  const onnx::AttributeProto* perm = node == nullptr ? nullptr : node->FindAttribute("perm");
  return perm == nullptr ? Perm() : Perm(perm->ints().begin(), perm->ints().end());
}

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

}  // namespace

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

namespace {

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
  // Element k of the buffer is set exactly where its column is at most its row. Read in place: one
  // buffer shared by every layer is checked once per layer.
  auto lower_triangular = [n](int64_t count, auto&& is_set) {
    if (count != n * n) return false;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if (is_set(i * n + j) != (j <= i)) return false;
      }
    }
    return true;
  };
  if (buffer->data_type() == onnx::TensorProto::BOOL || buffer->data_type() == onnx::TensorProto::UINT8) {
    std::string scratch;
    if (const std::string* raw = RawBytes(*buffer, &scratch)) {
      return lower_triangular(static_cast<int64_t>(raw->size()),
                              [&](int64_t k) { return (*raw)[static_cast<size_t>(k)] != 0; });
    }
    return lower_triangular(buffer->int32_data_size(),
                            [&](int64_t k) { return buffer->int32_data(static_cast<int>(k)) != 0; });
  }
  const std::optional<std::vector<float>> floats = TensorFloats(*buffer);
  return floats && lower_triangular(static_cast<int64_t>(floats->size()),
                                    [&](int64_t k) { return (*floats)[static_cast<size_t>(k)] != 0; });
}

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

// Whether `value` is a [B,S] tensor made [B,1,1,S] by Unsqueeze: one with axes (1, 2), or a chain
// (torch.jit exports mask[:, None, None, :] as two); sets *bs to the [B,S] tensor. The chain is
// replayed on the dims' labels, each Unsqueeze inserting at its axes in ascending order.
bool UnsqueezedFromBS(const Graph& graph, const ShapeInfo& shapes, const std::string& value, std::string* bs) {
  std::vector<const Node*> chain;  // the last Unsqueeze first
  std::string source = value;
  while (chain.size() < 2) {
    const Node* unsqueeze = ProducerWithOp(graph, source, "Unsqueeze");
    if (unsqueeze == nullptr) break;
    chain.push_back(unsqueeze);
    source = unsqueeze->input(0);
    if (shapes.Rank(source).value_or(0) == 2) break;
  }
  if (chain.empty() || shapes.Rank(source).value_or(0) != 2) return false;
  std::vector<char> dims = {'B', 'S'};
  for (auto unsqueeze = chain.rbegin(); unsqueeze != chain.rend(); ++unsqueeze) {
    std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, **unsqueeze);
    if (!axes || axes->empty()) return false;
    const int64_t rank = static_cast<int64_t>(dims.size() + axes->size());
    for (int64_t& axis : *axes) axis += axis < 0 ? rank : 0;
    std::sort(axes->begin(), axes->end());
    if (axes->front() < 0 || axes->back() >= rank || std::adjacent_find(axes->begin(), axes->end()) != axes->end()) {
      return false;
    }
    for (int64_t axis : *axes) dims.insert(dims.begin() + axis, '1');
  }
  if (dims != std::vector<char>{'B', '1', '1', 'S'}) return false;
  *bs = source;
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
  if (!UnsqueezedFromBS(graph, shapes, value, raw_mask)) {
    *reason = "the mask is not a [B,S] mask unsqueezed to [B,1,1,S]";
    return false;
  }
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

namespace {

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

}  // namespace

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

}  // namespace onnxopt::attention
