// com.microsoft::Attention from a matched block (attention_emit.h):
//   y = Attention(x, [Wq|Wk|Wv], [bq|bk|bv], Cast(mask, int32), num_heads=N, scale, unidirectional,
//                 mask_filter_value, attention_bias)   (then MatMul(Wo^T) + bo for the sequence-first form)
// Checked: one x for Q, K and V (for the sequence-first form, a batch-first tensor transposed); a
// scalar scale on the Q or K projection before the head split (Whisper) goes into the scale, none on V;
// constant float weights [H_in, H] (separate) or one packed [H_in, 3H] split into three equal parts in
// order; the sequence-first output projection a float [H, H] with bias [H].
#include <cmath>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/fusion/attention_emit.h"

namespace onnxopt::attention {
namespace {

// One packed projection (Q|K|V parts in order): its weight and bias become the Attention's as they
// are; their types are checked, their values not read.
MatchResult<Matched> CheckPacked(const Graph& graph, const AttentionMatch& match, const onnx::TensorProto& q_weight) {
  const Projection &q = match.q, &k = match.k, &v = match.v;
  const int64_t hidden = match.hidden;
  const onnx::TensorProto* b = q.bias.empty() ? nullptr : ConstantTensor(graph, q.bias);
  const bool bias_ok = q.bias.empty() || (b != nullptr && b->dims_size() == 1 && b->dims(0) == 3 * hidden &&
                                          b->data_type() == onnx::TensorProto::FLOAT);
  if (k.matmul != q.matmul || v.matmul != q.matmul || k.add != q.add || v.add != q.add || q.offset != 0 ||
      k.offset != hidden || v.offset != 2 * hidden || k.size != hidden || v.size != hidden ||
      q_weight.dims(1) != 3 * hidden || !bias_ok || q_weight.data_type() != onnx::TensorProto::FLOAT) {
    return Fail("the packed Q/K/V projection is not split into three equal float parts in order");
  }
  return Matched{};
}

// Separate projections: float constants [H_in, H], biases [H] (zeros where there is none).
MatchResult<Matched> ReadSeparate(const Graph& graph, const AttentionMatch& match, AttentionPlan* plan) {
  const Projection* projections[3] = {&match.q, &match.k, &match.v};
  for (int i = 0; i < 3; ++i) {
    const int64_t width = i == 2 ? match.OutputWidth() : match.hidden;
    const onnx::TensorProto* w = ConstantTensor(graph, projections[i]->weight);
    if (w == nullptr || w->dims_size() != 2 || w->dims(0) != plan->input_hidden || w->dims(1) != width) {
      return Fail("projection weights are not float constants of one width");
    }
    auto wf = TensorFloats(*w);
    auto bf = projections[i]->bias.empty()
                  ? std::optional<std::vector<float>>(std::vector<float>(static_cast<size_t>(width), 0.0f))
                  : ConstantFloats(graph, projections[i]->bias);
    if (!wf || !bf || bf->size() != static_cast<size_t>(width)) {
      return Fail("projection weights are not float constants of one width");
    }
    plan->weights[i] = *std::move(wf);
    plan->biases[i] = *std::move(bf);
  }
  return Matched{};
}

// The sequence-first form's output projection, as a [H, H] float constant with a [H] bias.
MatchResult<std::vector<float>> ReadOutputProjection(const Graph& graph, const AttentionMatch& match) {
  const onnx::TensorProto* w = ConstantTensor(graph, match.out.out_weight);
  auto bf = ConstantFloats(graph, match.out.out_bias);
  const int64_t hidden = match.hidden;
  if (w == nullptr || w->dims_size() != 2 || w->dims(0) != hidden || w->dims(1) != hidden || !bf ||
      bf->size() != static_cast<size_t>(hidden)) {
    return Fail("the output projection is not a float constant [H, H]");
  }
  auto wf = TensorFloats(*w);
  if (!wf) return Fail("the output projection is not a float constant [H, H]");
  return *std::move(wf);
}

// What Attention replaces: the core, the projections inside it, the causal mask's Slices when
// nothing else reads them (layers may share one after CSE), and the sequence-first input transpose.
MatchResult<Matched> ClaimAttentionPattern(const Graph& graph, const AttentionMatch& match, Node* input_transpose,
                                           AttentionPlan* plan) {
  std::vector<Node*>& pattern = plan->pattern;
  pattern = CorePattern(match);
  if (input_transpose != nullptr) pattern.push_back(input_transpose);
  std::set<Node*> members;
  for (const Projection* p : {&match.q, &match.k, &match.v}) {
    for (Node* node : {p->matmul, p->add, p->part, p->scaling, p->reshape}) {
      if (node != nullptr && members.insert(node).second) pattern.push_back(node);
    }
    pattern.insert(pattern.end(), p->transposes.begin(), p->transposes.end());
  }
  std::set<Node*> targets = {match.q.reshape, match.k.reshape, match.v.reshape};
  targets.insert(match.out.reshapes.begin(), match.out.reshapes.end());
  ClaimCausalBuffer(graph, match, &pattern, &targets);
  // A stacked cache's nodes go too: Attention reads the past and writes the present again.
  std::set<std::string> reproduced;
  if (match.stacked_cache) {
    for (Node* node : match.stacked_cache->nodes) {
      if (members.insert(node).second) pattern.push_back(node);
    }
    if (!match.stacked_cache->present.empty()) reproduced.insert(match.stacked_cache->present);
  }
  reproduced.insert(match.fresh_presents.begin(), match.fresh_presents.end());
  MatchResult<std::vector<Node*>> shape_nodes = ClaimPattern(graph, pattern, targets, match.out.output, reproduced);
  if (!shape_nodes) return shape_nodes.failure();
  plan->shape_nodes = *std::move(shape_nodes);
  return Matched{};
}

// The sequence-first form's output projection, row-wise on the batch-first result: MatMul(W) + b.
void EmitOutputProjection(Graph& graph, const AttentionMatch& match, const AttentionPlan& plan,
                          const std::string& attended, const Node* fused) {
  const int64_t hidden = match.hidden;
  std::string weight = match.out.out_weight;
  if (match.out.out_weight_transposed) {
    std::vector<float> transposed(plan.out_weight.size());
    for (int64_t row = 0; row < hidden; ++row) {
      for (int64_t col = 0; col < hidden; ++col) transposed[col * hidden + row] = plan.out_weight[row * hidden + col];
    }
    weight = graph.UniqueName(match.out.out_weight + "_transposed");
    graph.AddInitializer(MakeFloatTensor(weight, {hidden, hidden}, transposed));
  }
  const std::string name = graph.UniqueName("attention_output_projection");
  const std::string projected = graph.UniqueName(match.out.output + "_projected");
  const Node* matmul = graph.AddNode(MakeNode("MatMul", name, {attended, weight}, {projected}), fused, /*after=*/true);
  graph.AddNode(MakeNode("Add", graph.UniqueName("attention_output_bias"), {projected, match.out.out_bias},
                         {match.out.output}),
                matmul, /*after=*/true);
}

// The packed weight and bias: the projection's own, or the three separate ones packed row by row (V's
// part its own width).
std::pair<std::string, std::string> PackedWeights(Graph& graph, const AttentionMatch& match, const AttentionPlan& plan) {
  const int64_t hidden = match.hidden, input_hidden = plan.input_hidden;
  if (plan.packed) {
    std::string bias = match.q.bias;
    if (bias.empty()) {  // Attention takes a bias: zeros
      bias = graph.UniqueName("attention_qkv_bias");
      graph.AddInitializer(MakeFloatTensor(bias, {3 * hidden}, std::vector<float>(static_cast<size_t>(3 * hidden), 0.0f)));
    }
    return {match.q.weight, bias};
  }
  const int64_t widths[3] = {hidden, hidden, match.OutputWidth()};
  const int64_t packed_width = widths[0] + widths[1] + widths[2];
  std::vector<float> packed_weight(static_cast<size_t>(input_hidden * packed_width));
  for (int64_t row = 0; row < input_hidden; ++row) {
    int64_t column = row * packed_width;
    for (int i = 0; i < 3; ++i) {
      std::copy(plan.weights[i].begin() + row * widths[i], plan.weights[i].begin() + (row + 1) * widths[i],
                packed_weight.begin() + column);
      column += widths[i];
    }
  }
  std::vector<float> packed_bias;
  for (int i = 0; i < 3; ++i) packed_bias.insert(packed_bias.end(), plan.biases[i].begin(), plan.biases[i].end());
  const std::string weight = graph.UniqueName("attention_qkv_weight");
  const std::string bias = graph.UniqueName("attention_qkv_bias");
  graph.AddInitializer(MakeFloatTensor(weight, {input_hidden, packed_width}, packed_weight));
  graph.AddInitializer(MakeFloatTensor(bias, {packed_width}, packed_bias));
  return {weight, bias};
}

}  // namespace

MatchResult<AttentionPlan> PlanAttention(const Graph& graph, const ShapeInfo& shapes, const AttentionMatch& match) {
  AttentionPlan plan;
  if (match.q.x != match.k.x || match.q.x != match.v.x) return Fail("Q, K and V are not projections of one input");
  plan.input = match.q.x;
  Node* input_transpose = nullptr;
  if (match.layout == Layout::kSequenceFirst) {
    input_transpose = ProducerWithOp(graph, match.q.x, "Transpose");
    if (input_transpose == nullptr || PermOf(input_transpose) != Perm{1, 0, 2}) {
      return Fail("the sequence-first projections do not read a transposed batch-first input");
    }
    plan.input = input_transpose->input(0);
  }
  if (shapes.Rank(plan.input).value_or(0) != 3) return Fail("the attention input is not known to be 3-D");
  // A scale on Q or K scales the scores (into Attention's scale); one on V would scale the context.
  if (match.v.scaling != nullptr) return Fail("V is scaled before its head split");
  const onnx::TensorProto& q_weight = *ConstantTensor(graph, match.q.weight);  // MatchAttention checked it
  plan.input_hidden = q_weight.dims(0);
  plan.packed = match.q.part != nullptr;
  MatchResult<Matched> weights = plan.packed ? CheckPacked(graph, match, q_weight) : ReadSeparate(graph, match, &plan);
  if (!weights) return weights.failure();
  if (match.layout == Layout::kSequenceFirst) {
    MatchResult<std::vector<float>> out_weight = ReadOutputProjection(graph, match);
    if (!out_weight) return out_weight.failure();
    plan.out_weight = *std::move(out_weight);
  }
  if (MatchResult<Matched> claimed = ClaimAttentionPattern(graph, match, input_transpose, &plan); !claimed) {
    return claimed.failure();
  }
  return plan;
}

void EmitAttention(Graph& graph, const AttentionMatch& match, const AttentionPlan& plan, FusionState* state,
                   PassContext& context) {
  const auto [weight, bias] = PackedWeights(graph, match, plan);
  const MaskPlan& mask = match.mask;
  const std::string name = graph.UniqueName("Attention");
  std::vector<std::string> inputs = {plan.input, weight, bias};
  if (!mask.raw_mask.empty()) inputs.push_back(state->int32_masks.Get(graph, mask.raw_mask, match.q.matmul));
  const bool batch_first = match.layout == Layout::kBatchFirst;
  const std::string attended =
      batch_first && !NeedsFinishing(match) ? match.out.output : graph.UniqueName(match.out.output + "_attention");
  const Node* anchor = RemovePattern(graph, match, plan.pattern, plan.shape_nodes);
  NodeChain chain(graph, anchor);
  const std::string attention_bias = AttentionBias(graph, match, state, &chain);
  const std::string past = match.stacked_cache ? match.stacked_cache->past : "";
  if (!attention_bias.empty() || !past.empty()) {
    if (mask.raw_mask.empty()) inputs.push_back("");  // mask_index
    inputs.push_back(past);
    if (!attention_bias.empty()) inputs.push_back(attention_bias);
  }
  std::vector<std::string> outputs = {attended};
  if (match.stacked_cache && !match.stacked_cache->present.empty()) outputs.push_back(match.stacked_cache->present);
  onnx::NodeProto attention = MakeNode("Attention", name, std::move(inputs), std::move(outputs), "com.microsoft");
  *attention.add_attribute() = MakeIntAttribute("num_heads", match.num_heads);
  if (match.v_hidden > 0) {
    *attention.add_attribute() = MakeIntsAttribute("qkv_hidden_sizes", {match.hidden, match.hidden, match.v_hidden});
  }
  if (mask.causal) *attention.add_attribute() = MakeIntAttribute("unidirectional", 1);
  if (!mask.raw_mask.empty()) *attention.add_attribute() = MakeFloatAttribute("mask_filter_value", mask.filter);
  const float scale = match.scores.scale * match.q.scale * match.k.scale;
  if (std::fabs(scale * std::sqrt(static_cast<float>(match.head_size)) - 1.0f) > 1e-6f) {
    *attention.add_attribute() = MakeFloatAttribute("scale", scale);
  }
  const Node* fused = chain.AddNode(std::move(attention));
  CountRowsMaskedEntirely(match, *fused, state, context);
  if (batch_first) FinishAttentionOutput(graph, context, match, attended, fused, state);
  if (!batch_first) EmitOutputProjection(graph, match, plan, attended, fused);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
}

}  // namespace onnxopt::attention
