// The scores of an attention block and what masks them (attention_match.h).
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/fusion/attention_match.h"

namespace onnxopt::attention {
namespace {

// Element k of the [n, n] buffer is set exactly where its column is at most its row. Read in place:
// one buffer shared by every layer is checked once per layer.
bool IsLowerTriangular(const onnx::TensorProto& buffer, int64_t n) {
  auto lower_triangular = [n](int64_t count, auto&& is_set) {
    if (count != n * n) return false;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if (is_set(i * n + j) != (j <= i)) return false;
      }
    }
    return true;
  };
  if (buffer.data_type() == onnx::TensorProto::BOOL || buffer.data_type() == onnx::TensorProto::UINT8) {
    std::string scratch;
    if (const std::string* raw = RawBytes(buffer, &scratch)) {
      return lower_triangular(static_cast<int64_t>(raw->size()),
                              [&](int64_t k) { return (*raw)[static_cast<size_t>(k)] != 0; });
    }
    return lower_triangular(buffer.int32_data_size(),
                            [&](int64_t k) { return buffer.int32_data(static_cast<int>(k)) != 0; });
  }
  const std::optional<std::vector<float>> floats = TensorFloats(buffer);
  return floats && lower_triangular(static_cast<int64_t>(floats->size()),
                                    [&](int64_t k) { return (*floats)[static_cast<size_t>(k)] != 0; });
}

// (t, axis) where `value` reads one dim of a tensor t's shape (ShapeDimRead), possibly squeezed,
// unsqueezed or cast.
std::optional<std::pair<std::string, int64_t>> ShapeDimBehind(const Graph& graph, const ShapeInfo& shapes,
                                                              std::string value) {
  for (int depth = 0; depth < 4; ++depth) {
    Node* producer = graph.Producer(value);
    if (producer == nullptr || !producer->domain().empty() || producer->input_size() < 1) return std::nullopt;
    const std::string op(producer->op_type());
    if (op != "Unsqueeze" && op != "Squeeze" && op != "Cast" && op != "Identity") {
      return ShapeDimRead(graph, shapes, *producer);
    }
    value = producer->input(0);
  }
  return std::nullopt;
}

// True if element `index` of `value` is the scores' key length T (`axis` 3) or query length S (2): a
// read of that dim of the scores, of Q (S), of K^T (T) or of K under its K^T transpose, or a value the
// shapes pin to the scores' dim.
bool IsScoresLength(const Graph& graph, const ShapeInfo& shapes, const Scores& scores, const std::string& scored,
                    const std::string& value, size_t index, int64_t axis) {
  if (ElementIsDim(graph, shapes, value, index, scored, static_cast<int>(axis))) return true;
  if (index != 0 || ShapeValueSize(graph, shapes, value).value_or(1) != 1) return false;
  const auto read = ShapeDimBehind(graph, shapes, value);
  if (!read) return false;
  const auto& [tensor, dim] = *read;
  if ((tensor == scored || tensor == scores.qk->output(0)) && dim == axis) return true;
  if (axis == 2) return tensor == scores.q_heads && dim == 2;
  if (tensor == scores.k_heads && dim == 3) return true;
  Node* swap = ProducerWithOp(graph, scores.k_heads, "Transpose");
  return swap != nullptr && PermOf(swap) == Perm{0, 1, 3, 2} && tensor == swap->input(0) && dim == 2;
}

// True if `value` reads a cache's past length P: the growing dim of a tensor that a Concat on that axis
// joins the new keys or values to (`torch.cat((past_key, k), dim=-2)`), or the past input of a layer this
// pass has fused already (its sequence axis, 2).
bool IsPastLength(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  const auto read = ShapeDimBehind(graph, shapes, value);
  if (!read) return false;
  const auto& [past, dim] = *read;
  const std::optional<int> rank = shapes.Rank(past);
  if (!rank) return false;
  for (const Node* reader : graph.Consumers(past)) {
    if (reader->domain() == "com.microsoft" && dim == 2 && *rank == 4) {
      const int first = reader->op_type() == "GroupQueryAttention" ? 3 : reader->op_type() == "MultiHeadAttention" ? 6 : -1;
      if (first >= 0 && reader->input_size() > first + 1 &&
          (reader->input(first) == past || reader->input(first + 1) == past)) {
        return true;
      }
    }
    if (reader->op_type() != "Concat" || !reader->domain().empty() || reader->input_size() != 2 ||
        reader->input(0) != past) {
      continue;
    }
    int64_t axis = reader->GetAttributeInt("axis", 0);
    if (axis < 0) axis += *rank;
    if (axis == dim) return true;
  }
  return false;
}

// True if the one-element `value` is the scores' key length T: a read of it (IsScoresLength), or the
// past's length plus the queries' (T = P + S, as a mask made once for every layer counts it).
bool IsKeyLength(const Graph& graph, const ShapeInfo& shapes, const Scores& scores, const std::string& scored,
                 std::string value) {
  if (IsScoresLength(graph, shapes, scores, scored, value, 0, 3)) return true;
  if (Node* unsqueeze = ProducerWithOp(graph, value, "Unsqueeze")) value = unsqueeze->input(0);
  Node* add = ProducerWithOp(graph, value, "Add");
  if (add == nullptr || add->input_size() != 2) return false;
  for (int past = 0; past < 2; ++past) {
    if (IsPastLength(graph, shapes, add->input(past)) &&
        IsScoresLength(graph, shapes, scores, scored, add->input(1 - past), 0, 2)) {
      return true;
    }
  }
  return false;
}

// True if the one-element `start` is T - S, as Sub(T, S) of the scores' lengths (possibly unsqueezed).
bool IsPastOffset(const Graph& graph, const ShapeInfo& shapes, const Scores& scores, const std::string& scored,
                  std::string start) {
  if (Node* unsqueeze = ProducerWithOp(graph, start, "Unsqueeze")) start = unsqueeze->input(0);
  Node* sub = ProducerWithOp(graph, start, "Sub");
  return sub != nullptr && IsKeyLength(graph, shapes, scores, scored, sub->input(0)) &&
         IsScoresLength(graph, shapes, scores, scored, sub->input(1), 0, 2);
}

// True if `cond` is a lower-triangular (causal) buffer [1,1,M,M] sliced to the scores' [S, T] on its
// last two axes, as GPT-2 style models write `bias[:, :, :S, :S]` (possibly cast to bool), or with a
// past `bias[:, :, T-S:T, :T]` (query i sees keys up to T - S + i).
bool IsCausalSlice(const Graph& graph, const ShapeInfo& shapes, const std::string& cond,
                                const std::string& scored, const Scores& scores) {
  std::string value = cond;
  // A 0/1 buffer of another type made boolean after its slices (GPT-2's uint8 `bias` in older exports).
  if (Node* cast = ProducerWithOp(graph, value, "Cast"); cast != nullptr && cast->GetAttributeInt("to", 0) == onnx::TensorProto::BOOL) {
    value = cast->input(0);
  }
  std::set<int64_t> sliced_axes;
  // Either shape inference shows the slice is [.., S, T], or every end is the scores' dim.
  bool ends_match = true;
  for (int depth = 0; depth < 3; ++depth) {
    Node* slice = ProducerWithOp(graph, value, "Slice");
    if (slice == nullptr) break;
    if (slice->input_size() < 4) return false;  // the axes are given
    const std::optional<SliceSpec> spec = ParseSlice(graph, *slice);
    if (!spec) return false;
    for (size_t i = 0; i < spec->axes.size(); ++i) {
      const int64_t axis = spec->axes[i] < 0 ? spec->axes[i] + 4 : spec->axes[i];
      if (spec->steps[i] != 1 || (axis != 2 && axis != 3)) return false;
      // The rows of a past's chunk: T - S to T.
      const bool past_rows = axis == 2 && !spec->starts && spec->axes.size() == 1 &&
                             IsPastOffset(graph, shapes, scores, scored, slice->input(1)) &&
                             IsKeyLength(graph, shapes, scores, scored, slice->input(2));
      if (!past_rows && (!spec->starts || (*spec->starts)[i] != 0)) return false;
      sliced_axes.insert(axis);
      const bool keys_end = axis == 3 && spec->axes.size() == 1 && IsKeyLength(graph, shapes, scores, scored, slice->input(2));
      ends_match &= past_rows || keys_end || IsScoresLength(graph, shapes, scores, scored, slice->input(2), i, axis);
    }
    value = slice->input(0);
  }
  if (!ends_match && !(shapes.SameDim(cond, -1, scored, -1) && shapes.SameDim(cond, -2, scored, -2))) return false;
  const onnx::TensorProto* buffer = ConstantTensor(graph, value);
  return buffer != nullptr && buffer->dims_size() == 4 && buffer->dims(0) == 1 && buffer->dims(1) == 1 &&
         buffer->dims(2) == buffer->dims(3) && sliced_axes == std::set<int64_t>{2, 3} &&
         IsLowerTriangular(*buffer, buffer->dims(2));
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

// Whether `value` is a [B,S] tensor made [B,1,1,S] by Unsqueeze: one with axes (1, 2), or a chain
// (torch.jit exports mask[:, None, None, :] as two); the [B,S] tensor. The chain is replayed on the
// dims' labels, each Unsqueeze inserting at its axes in ascending order.
std::optional<std::string> UnsqueezedFromBS(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  std::vector<const Node*> chain;  // the last Unsqueeze first
  std::string source = value;
  while (chain.size() < 2) {
    const Node* unsqueeze = ProducerWithOp(graph, source, "Unsqueeze");
    if (unsqueeze == nullptr) break;
    chain.push_back(unsqueeze);
    source = unsqueeze->input(0);
    if (shapes.Rank(source).value_or(0) == 2) break;
  }
  if (chain.empty() || shapes.Rank(source).value_or(0) != 2) return std::nullopt;
  std::vector<char> dims = {'B', 'S'};
  for (auto unsqueeze = chain.rbegin(); unsqueeze != chain.rend(); ++unsqueeze) {
    std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, **unsqueeze);
    if (!axes || axes->empty()) return std::nullopt;
    const int64_t rank = static_cast<int64_t>(dims.size() + axes->size());
    for (int64_t& axis : *axes) axis += axis < 0 ? rank : 0;
    std::sort(axes->begin(), axes->end());
    if (axes->front() < 0 || axes->back() >= rank || std::adjacent_find(axes->begin(), axes->end()) != axes->end()) {
      return std::nullopt;
    }
    for (int64_t axis : *axes) dims.insert(dims.begin() + axis, '1');
  }
  if (dims != std::vector<char>{'B', '1', '1', 'S'}) return std::nullopt;
  return source;
}

// The additive mask `(1 - Cast(Unsqueeze(mask[B,S], [1,2]))) * c`: the raw [B,S] mask and c.
MatchResult<MaskPlan> MatchAdditiveMask(const Graph& graph, const ShapeInfo& shapes, const std::string& term) {
  std::optional<PathMatch> path = MatchPath(graph, term, {{"Mul", kAnyInput}, {"Sub", 1}}, [&](const PathMatch& p) {
    return ConstantScalarFloat(graph, p.Other(0)).has_value();
  });
  MaskPlan plan;
  if (path) plan.filter = *ConstantScalarFloat(graph, path->Other(0));
  if (!path || !IsScalarNear(graph, path->nodes[1]->input(0), 1.0, 0.0) || plan.filter > -1.0f) {
    return Fail("the mask is not in the (1 - mask) * c form");
  }
  std::string value = path->end;
  if (Node* cast = ProducerWithOp(graph, value, "Cast")) value = cast->input(0);
  std::optional<std::string> raw = UnsqueezedFromBS(graph, shapes, value);
  if (!raw) return Fail("the mask is not a [B,S] mask unsqueezed to [B,1,1,S]");
  plan.raw_mask = *raw;
  return plan;
}

// True if `term` can be ONNX Runtime's attention_bias for these scores: [B|1, N|1, S, T] with the
// scores' S and T (only the first two axes broadcast there).
bool FitsAttentionBias(const ShapeInfo& shapes, const std::string& term, const std::string& scores, int64_t heads) {
  if (shapes.Rank(term).value_or(0) != 4 || !shapes.SameDim(term, -1, scores, -1) ||
      !shapes.SameDim(term, -2, scores, -2)) {
    return false;
  }
  const auto batch = shapes.DimValue(term, 0), head = shapes.DimValue(term, 1);
  return (!batch || *batch == 1 || shapes.SameDim(term, 0, scores, 0)) &&
         ((head && (*head == 1 || *head == heads)) || shapes.SameDim(term, 1, scores, 1));
}

// True if `cond` is an And (through nested Ands) with a conjunct that probes as exactly causal: the whole
// mask then never lets a query see a later key, at every length, whatever the other conjuncts mask (a
// sliding window wider than can be probed: Mistral's 4096).
bool HasCausalConjunct(const Graph& graph, const PassContext& context, const std::string& cond, FusionState* state,
                       int depth = 0) {
  Node* conjunction = ProducerWithOp(graph, cond, "And");
  if (conjunction == nullptr || depth > 8) return false;
  for (int i = 0; i < conjunction->input_size(); ++i) {
    const std::string& conjunct = conjunction->input(i);
    if (state->probes.Probe(graph, context, conjunct).kind == MaskMeaning::Kind::kCausal ||
        HasCausalConjunct(graph, context, conjunct, state, depth + 1)) {
      return true;
    }
  }
  return false;
}

// What the boolean mask term Where(cond, 0, fill) gives masked scores (BooleanMaskCondition checked it).
float BooleanMaskFill(const Graph& graph, const std::string& term) {
  return *ConstantScalarFloat(graph, graph.Producer(term)->input(2));
}

// True if the original gives 0 on a row its mask `cond` masks entirely: -inf behind the SDPA path's NaN
// guard, or any fill under a masked_fill(m, 0) of the probabilities.
bool ZeroesRowsMaskedEntirely(const AttentionMatch& match, float fill) {
  return (std::isinf(fill) && !match.nan_guard.empty()) || !match.zeroed_condition.empty();
}

// A boolean mask by its probed meaning, `fill` what its Where(cond, 0, fill) gives masked scores; with
// `additive`, `cond` is a float additive mask (0 or at most -1e4, probed as such), filling with the lowest
// float, and a meaning the operators take no other way goes in as it is, as the bias.
MatchResult<MaskPlan> PlanBooleanMask(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                      const AttentionMatch& match, float fill, const std::string& cond,
                                      FusionState* state, bool additive = false) {
  const MaskMeaning& meaning = state->probes.Probe(graph, context, cond, additive);
  const bool zero_rows = ZeroesRowsMaskedEntirely(match, fill);
  MaskPlan plan;
  plan.additive = additive;
  switch (meaning.kind) {
    case MaskMeaning::Kind::kAllTrue:  // no mask input
      return plan;
    case MaskMeaning::Kind::kAllFalse:
      // Every row masked entirely: 0 where the original zeroes such rows, the output zeroed from the
      // condition itself (no mask needed before that).
      if (!zero_rows || match.layout != Layout::kBatchFirst) return Fail("a mask that masks every position");
      plan.zero_masked_rows = true;
      plan.row_condition = cond;
      return plan;
    case MaskMeaning::Kind::kCausal:
      plan.causal = plan.within_causal = true;
      return plan;
    case MaskMeaning::Kind::kCausalKeyPadding:
      plan.causal = plan.within_causal = true;
      // Left padding masks the first rows entirely (every key they may see is padding): 0 behind the
      // NaN guard, the mean of V in the fused operator; zeroed where the condition tells the rows.
      [[fallthrough]];
    case MaskMeaning::Kind::kKeyPadding:
      // A batch row of padding only: under a masked_fill(m, 0) of the probabilities, 0 as well.
      if (zero_rows && (meaning.kind == MaskMeaning::Kind::kCausalKeyPadding || !match.zeroed_condition.empty())) {
        if (match.layout == Layout::kBatchFirst && (meaning.bias_shaped || shapes.DimValue(cond, 1) == 1)) {
          plan.zero_masked_rows = true;
          plan.row_condition = cond;
        } else if (!match.zeroed_condition.empty()) {
          return Fail("probabilities zeroed behind a mask per head or on sequence-first heads");
        }
      }
      plan.raw_mask = meaning.padding_input;
      plan.raw_mask_inverted = meaning.padding_inverted;
      plan.filter = std::isinf(fill) ? std::numeric_limits<float>::lowest() : fill;
      return plan;
    case MaskMeaning::Kind::kSlidingWindow:
    case MaskMeaning::Kind::kSlidingWindowKeyPadding:
      plan.window = meaning.window;
      plan.window_padding = meaning.padding_input;
      plan.filter = std::isinf(fill) ? std::numeric_limits<float>::lowest() : fill;
      break;  // and the condition as a bias, for the operators without a window
    case MaskMeaning::Kind::kUnknown:
      break;
  }
  // Another meaning: the condition as a bias, when shaped like one (shapes unknown, as at opset 20:
  // the probe saw [B|1, 1, L, L] at every length).
  if (FitsAttentionBias(shapes, match.scores.mask_term, match.softmax->input(0), match.num_heads) ||
      meaning.bias_shaped) {
    if (additive) {
      plan.bias = cond;
      plan.within_causal = plan.bias_within_causal = meaning.within_causal;
      return plan;
    }
    plan.bias_condition = cond;
    plan.within_causal = meaning.within_causal || HasCausalConjunct(graph, context, cond, state);
    // -inf behind a NaN guard gives 0 on a row masked entirely; only a [B|1, 1, S, T] condition tells
    // the row for every head at once.
    if (zero_rows) {
      if (!meaning.bias_shaped && shapes.DimValue(cond, 1) != 1) {
        return Fail("a -inf mask per head, whose entirely masked rows the fused operator would not zero");
      }
      if (match.layout != Layout::kBatchFirst) return Fail("a -inf mask as a bias on sequence-first heads");
      plan.zero_masked_rows = true;
      plan.row_condition = cond;
    }
    return plan;
  }
  return Fail(absl::StrCat("the boolean mask is not understood (", meaning.why,
                           ") nor a [B|1, N|1, S, T] term with the scores' S and T"));
}

}  // namespace

std::optional<std::string> BooleanMaskCondition(const Graph& graph, const std::string& term) {
  Node* where = ProducerWithOp(graph, term, "Where");
  if (where == nullptr) return std::nullopt;
  const std::optional<float> zero = ConstantScalarFloat(graph, where->input(1));
  const std::optional<float> fill = ConstantScalarFloat(graph, where->input(2));
  if (!zero || *zero != 0.0f || !fill || !(*fill <= -1e4f)) return std::nullopt;
  return where->input(0);
}

MatchResult<Scores> MatchScores(const Graph& graph, const ShapeInfo& shapes, Node* softmax) {
  static constexpr char kNotCausal[] = "Where before Softmax is not a causal mask of the scores' [S, T]";
  Scores scores;
  std::string value = softmax->input(0);
  if (Node* max = ProducerWithOp(graph, value, "Max"); max != nullptr && max->input_size() == 2) {
    const std::optional<int> bound = FindOperand(*max, [&](const std::string& operand) {
      const std::optional<float> c = ConstantScalarFloat(graph, operand);
      return c && *c <= -1e4f;
    });
    if (!bound) return Fail("a Max before Softmax that is not a clamp at a large negative constant");
    scores.clamp = max;
    value = OtherInput(*max, *bound);
  }
  for (int step = 0; step < 2; ++step) {
    if (Node* where = ProducerWithOp(graph, value, "Where"); where != nullptr && scores.causal_where == nullptr) {
      auto fill = ConstantScalarFloat(graph, where->input(2));
      if (!fill || *fill > -1e4f) return Fail(kNotCausal);
      scores.causal_where = where;  // its condition is checked once Q and K are known
      value = where->input(1);
      continue;
    }
    if (scores.mask_add != nullptr) break;
    Node* add = ProducerWithOp(graph, value, "Add");
    if (add == nullptr) break;
    const std::optional<int> side =
        FindOperand(*add, [&](const std::string& operand) { return LeadsToScores(graph, operand); });
    if (!side) return Fail();
    scores.mask_add = add;
    scores.mask_term = OtherInput(*add, *side);
    value = add->input(*side);
  }
  if (auto post = ScalarScale(graph, graph.Producer(value))) {
    scores.post_scale = graph.Producer(value);
    scores.scale = post->first;
    value = post->second;
  }
  scores.qk = ProducerWithOp(graph, value, "MatMul");
  if (scores.qk == nullptr) return Fail();
  scores.q_heads = scores.qk->input(0);
  scores.k_heads = scores.qk->input(1);
  for (std::string* heads : {&scores.q_heads, &scores.k_heads}) {
    Node* producer = graph.Producer(*heads);
    if (auto pre = ScalarScale(graph, producer)) {
      scores.pre_scales.push_back(producer);
      scores.scale *= pre->first;
      *heads = pre->second;
    }
  }
  if (const Node* where = scores.causal_where;
      where != nullptr && !IsCausalSlice(graph, shapes, where->input(0), where->input(1), scores)) {
    return Fail(kNotCausal);
  }
  return scores;
}

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

Node* MatchZeroedProbs(const Graph& graph, Node* softmax, AttentionMatch* match) {
  const std::string& probs = softmax->output(0);
  Node* where = SoleConsumer(graph, probs);
  if (where == nullptr || where->op_type() != "Where" || !where->domain().empty() || where->input_size() != 3 ||
      graph.IsGraphOutput(probs) || where->input(0) == probs) {
    return nullptr;
  }
  const bool where_true = where->input(2) == probs;  // Where(m, 0, p); else Where(a, p, 0)
  const std::optional<float> zero = ConstantScalarFloat(graph, where->input(where_true ? 1 : 2));
  if (!zero || *zero != 0.0f || (!where_true && where->input(1) != probs)) return nullptr;
  match->zeroed_condition = where->input(0);
  match->zeroed_where_true = where_true;
  return where;
}

namespace {

// True if `a` is Not(b) (one Not node).
bool IsNotOf(const Graph& graph, const std::string& a, const std::string& b) {
  Node* negation = ProducerWithOp(graph, a, "Not");
  return negation != nullptr && negation->input(0) == b;
}

// True if the probabilities' masked_fill zeroes exactly the positions the mask's `allowed` condition
// masks: Where(m, 0, p) with m = Not(allowed) or allowed = Not(m), or Where(allowed, p, 0).
bool ZeroesWhatTheMaskMasks(const Graph& graph, const AttentionMatch& match, const std::string& allowed) {
  const std::string& zeroed = match.zeroed_condition;
  if (!match.zeroed_where_true) return zeroed == allowed;
  return IsNotOf(graph, allowed, zeroed) || IsNotOf(graph, zeroed, allowed);
}

// True if `term` is a constant with every element the same small number: Softmax does not see it
// (a shift of every score of a row); |c| <= 1 keeps the scores' rounding as it was.
bool IsUniformSmallConstant(const Graph& graph, const std::string& term) {
  const std::optional<std::vector<float>> values = ConstantFloats(graph, term);
  if (!values || values->empty()) return false;
  return std::all_of(values->begin(), values->end(),
                     [&](float v) { return v == values->front() && std::fabs(v) <= 1.0f; });
}

// A float term beside a boolean mask: Add(b, Where(cond, 0, fill)) in either order, b a
// [B|1, N|1, S, T] float bias (ESPnet's position term) or a uniform small constant (dropped).
struct BiasBesideMask {
  std::string bias;     // "" for the dropped constant
  std::string boolean;  // Where(cond, 0, fill)
  std::string cond;
};
std::optional<BiasBesideMask> BiasBesideBooleanMask(const Graph& graph, const ShapeInfo& shapes,
                                                    const AttentionMatch& match, const std::string& term) {
  Node* sum = ProducerWithOp(graph, term, "Add");
  if (sum == nullptr || sum->input_size() != 2) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const std::string& boolean = sum->input(side);
    const std::string& bias = sum->input(1 - side);
    const std::optional<std::string> cond = BooleanMaskCondition(graph, boolean);
    if (!cond) continue;
    if (IsUniformSmallConstant(graph, bias)) return BiasBesideMask{"", boolean, *cond};
    if (shapes.ElementType(bias) == onnx::TensorProto::FLOAT &&
        FitsAttentionBias(shapes, bias, match.softmax->input(0), match.num_heads)) {
      return BiasBesideMask{bias, boolean, *cond};
    }
  }
  return std::nullopt;
}

}  // namespace

MatchResult<MaskPlan> MatchMask(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                const AttentionMatch& match, FusionState* state) {
  const bool causal_buffer = match.scores.causal_where != nullptr;
  MatchResult<MaskPlan> plan = MaskPlan();
  std::optional<std::string> allowed;  // a boolean mask's condition
  if (match.scores.mask_add != nullptr) {
    const std::string& term = match.scores.mask_term;
    if ((allowed = BooleanMaskCondition(graph, term))) {
      plan = PlanBooleanMask(graph, shapes, context, match, BooleanMaskFill(graph, term), *allowed, state);
    } else if (std::optional<BiasBesideMask> beside = BiasBesideBooleanMask(graph, shapes, match, term)) {
      allowed = beside->cond;
      plan = PlanBooleanMask(graph, shapes, context, match, BooleanMaskFill(graph, beside->boolean), *allowed, state);
      if (plan && !beside->bias.empty()) {
        if (plan->window > 0) return Fail("a float bias beside a sliding window");
        plan->bias = beside->bias;
      }
    } else if (MatchResult<MaskPlan> additive = MatchAdditiveMask(graph, shapes, term)) {
      plan = *std::move(additive);
    } else if (shapes.ElementType(term) == onnx::TensorProto::FLOAT &&
               FitsAttentionBias(shapes, term, match.softmax->input(0), match.num_heads)) {
      // An additive mask of another form (older transformers' clamp(causal + (1 - mask) * min, min)) by
      // what it masks, probed; any other float term added to the scores (T5's relative position bias
      // plus its mask) as the bias.
      const MaskMeaning& meaning = state->probes.Probe(graph, context, term, /*additive=*/true);
      MaskPlan bias;
      bias.bias = term;
      if (meaning.kind != MaskMeaning::Kind::kUnknown) {
        MatchResult<MaskPlan> masked = PlanBooleanMask(graph, shapes, context, match,
                                                       std::numeric_limits<float>::lowest(), term, state,
                                                       /*additive=*/true);
        plan = masked ? *std::move(masked) : bias;
      } else {
        // A mask of no meaning the operators take, or no mask (the probe failed: within_causal false).
        bias.within_causal = bias.bias_within_causal = meaning.within_causal;
        bias.additive = true;
        plan = bias;
      }
    } else if (IsUniformSmallConstant(graph, term)) {
      plan = MaskPlan();  // the same shift of every score: no mask
    } else {
      return Fail(absl::StrCat(additive.reason(), ", nor a [B|1, N|1, S, T] float bias"));
    }
  }
  if (!match.zeroed_condition.empty() && (!allowed || !ZeroesWhatTheMaskMasks(graph, match, *allowed))) {
    return Fail("the probabilities are zeroed (masked_fill after Softmax) where the mask does not mask");
  }
  // A causal buffer keeps every query from later keys, whatever else the mask does.
  if (plan && causal_buffer) plan->causal = plan->within_causal = true;
  return plan;
}

}  // namespace onnxopt::attention
