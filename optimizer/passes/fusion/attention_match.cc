// One match of an attention block (attention_match.h), and the pattern its fused form replaces.
#include "optimizer/passes/fusion/attention_match.h"

#include "absl/strings/str_cat.h"

namespace onnxopt::attention {
namespace {

// The width of Q's projection: its part of a packed projection, or its constant weight [in, out].
MatchResult<int64_t> QueryWidth(const Graph& graph, const AttentionMatch& match) {
  const onnx::TensorProto* weight = ConstantTensor(graph, match.q.weight);
  if (weight == nullptr || weight->dims_size() != 2) return Fail("projection weights are not constant");
  return match.q.part != nullptr ? match.q.size : weight->dims(1);
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

}  // namespace

MatchResult<AttentionMatch> MatchAttention(const Graph& graph, Node* softmax, const ShapeInfo& shapes,
                                           const PassContext& context) {
  if (softmax->op_type() != "Softmax" || !softmax->domain().empty()) return Fail();
  const auto rank = shapes.Rank(softmax->input(0));
  // Before opset 13 Softmax defaults to axis 1 (over everything after it, flattened).
  const int64_t axis = softmax->GetAttributeInt("axis", context.OpsetVersion("") < 13 ? 1 : -1);
  if (!rank) {
    // Only worth a reason where the Softmax reads Q*K^T (an export without shape information, paddle2onnx's).
    const bool scores = ProducerWithOp(graph, softmax->input(0), "MatMul") != nullptr;
    return scores ? Fail("the scores' rank is not known (no shape information reaches the Softmax)") : Fail();
  }
  if ((*rank != 4 && *rank != 3) || (axis != -1 && axis != *rank - 1)) return Fail();
  AttentionMatch match;
  match.layout = *rank == 4 ? Layout::kBatchFirst : Layout::kSequenceFirst;
  match.softmax = softmax;
  MatchResult<Scores> scores = MatchScores(graph, shapes, softmax);
  if (!scores) return scores.failure();
  match.scores = *std::move(scores);
  match.nan_guard = MatchNanGuard(graph, softmax);
  if (match.nan_guard.empty()) {
    if (Node* zeroed = MatchZeroedProbs(graph, softmax, &match)) match.nan_guard = {zeroed};
  }
  const std::string& probs = match.nan_guard.empty() ? softmax->output(0) : match.nan_guard.back()->output(0);
  Node* context_matmul = SoleConsumer(graph, probs);
  if (context_matmul == nullptr || context_matmul->op_type() != "MatMul" || context_matmul->input(0) != probs) {
    return Fail();
  }
  MatchResult<ContextOutput> out = MatchContext(graph, shapes, match.layout, context_matmul);
  if (!out) return Fail("the context is not merged back to [B,S,H]");
  match.out = *std::move(out);
  if (MatchResult<Matched> heads = MatchHeads(graph, shapes, &match); !heads) {
    // The core fuses over the heads as the graph computes them; what computes them stays as it is.
    if (heads.reason().empty()) return heads.failure();
    match.q_rotation.reset();
    match.k_rotation.reset();
    match.k_repeat.reset();
    match.v_repeat.reset();
    match.cache.reset();
    MatchResult<Matched> given = MatchGivenHeads(graph, shapes, context, &match);
    if (!given) return Fail(absl::StrCat(heads.reason(), "; nor over the heads as given: ", given.reason()));
    match.kept_neighbour = heads.reason();
  }
  if (!match.q.Given()) {
    MatchResult<int64_t> width = QueryWidth(graph, match);
    if (!width) return width.failure();
    match.hidden = *width;
    // K as wide as Q and V not: V's heads are another size (grouped K/V narrow both).
    const onnx::TensorProto* k_weight = ConstantTensor(graph, match.k.weight);
    const onnx::TensorProto* v_weight = ConstantTensor(graph, match.v.weight);
    if (match.layout == Layout::kBatchFirst && match.v.part == nullptr && match.v.matmul != match.q.matmul &&
        !match.k_repeat && !match.v_repeat && k_weight != nullptr && k_weight->dims_size() == 2 &&
        k_weight->dims(1) == match.hidden && v_weight != nullptr && v_weight->dims_size() == 2 &&
        v_weight->dims(1) != match.hidden) {
      match.v_hidden = v_weight->dims(1);
    }
  }
  if (match.out.flattened && match.out.flat_width != match.OutputWidth()) {
    return Fail("the context is flattened to another width than the attention's");
  }
  if (MatchResult<Matched> counts = MatchHeadCounts(graph, shapes, context, &match); !counts) return counts.failure();
  return match;
}

void ClaimCausalBuffer(const Graph& graph, const AttentionMatch& match, std::vector<Node*>* pattern,
                       std::set<Node*>* targets) {
  if (match.scores.causal_where == nullptr) return;
  std::set<Node*> members(pattern->begin(), pattern->end());
  auto only_pattern_reads = [&](const Node& node) {
    bool only_pattern = !graph.IsGraphOutput(node.output(0));
    for (Node* reader : graph.Consumers(node.output(0))) only_pattern &= members.count(reader) > 0;
    return only_pattern;
  };
  std::string cond = match.scores.causal_where->input(0);
  // The Cast to bool of a 0/1 buffer of another type (CausalSlice read through it) goes first.
  if (Node* cast = ProducerWithOp(graph, cond, "Cast"); cast != nullptr && only_pattern_reads(*cast)) {
    pattern->push_back(cast);
    members.insert(cast);
    cond = cast->input(0);
  }
  Node* slice = ProducerWithOp(graph, cond, "Slice");
  for (int depth = 0; slice != nullptr && depth < 3; ++depth, slice = ProducerWithOp(graph, slice->input(0), "Slice")) {
    if (!only_pattern_reads(*slice)) break;
    pattern->push_back(slice);
    members.insert(slice);
    targets->insert(slice);
  }
}

std::vector<Node*> CorePattern(const AttentionMatch& match) {
  std::vector<Node*> pattern = {match.softmax, match.scores.qk, match.out.matmul};
  pattern.insert(pattern.end(), match.nan_guard.begin(), match.nan_guard.end());
  pattern.insert(pattern.end(), match.out.nodes.begin(), match.out.nodes.end());
  pattern.insert(pattern.end(), match.scores.pre_scales.begin(), match.scores.pre_scales.end());
  for (Node* node : {match.scores.post_scale, match.scores.mask_add, match.scores.clamp, match.scores.causal_where}) {
    if (node != nullptr) pattern.push_back(node);
  }
  return pattern;
}

MatchResult<std::vector<Node*>> ClaimPattern(const Graph& graph, const std::vector<Node*>& pattern,
                                             const std::set<Node*>& targets, const std::string& output,
                                             const std::set<std::string>& reproduced) {
  const std::set<Node*> members(pattern.begin(), pattern.end());
  std::vector<Node*> shape_nodes;
  for (Node* node : pattern) {
    for (const std::string& value : node->proto().output()) {
      if (value.empty() || value == output) continue;
      if (graph.IsGraphOutput(value) && reproduced.count(value) == 0) {
        return Fail("an intermediate value is a graph output");
      }
      for (Node* reader : graph.Consumers(value)) {
        if (members.count(reader) > 0) continue;
        if (!FeedsOnlyShapeInputs(graph, reader, targets, &shape_nodes)) {
          return Fail(absl::StrCat("an intermediate value (", node->op_type(), " output) is read outside the pattern by ",
                                   reader->op_type()));
        }
      }
    }
  }
  return shape_nodes;
}

const Node* RemovePattern(Graph& graph, const AttentionMatch& match, const std::vector<Node*>& pattern,
                          const std::vector<Node*>& shape_nodes) {
  const Node* anchor = match.out.nodes.back();
  // A first step's presents (AttentionMatch::fresh_presents) keep what computes them.
  std::set<const Node*> kept;
  if (!match.fresh_presents.empty()) {
    std::map<std::string, const Node*> producers;
    for (const std::vector<Node*>* nodes : {&pattern, &shape_nodes}) {
      for (const Node* node : *nodes) {
        for (const std::string& output : node->proto().output()) producers[output] = node;
      }
    }
    std::vector<std::string> needed(match.fresh_presents.begin(), match.fresh_presents.end());
    while (!needed.empty()) {
      auto producer = producers.find(needed.back());
      needed.pop_back();
      if (producer == producers.end() || !kept.insert(producer->second).second) continue;
      for (const std::string& input : producer->second->proto().input()) needed.push_back(input);
    }
  }
  for (const std::vector<Node*>* nodes : {&pattern, &shape_nodes}) {
    for (Node* node : *nodes) {
      if (!node->removed() && kept.count(node) == 0) graph.RemoveNode(node);
    }
  }
  return anchor;
}

void AddFlatten(Graph& graph, const std::string& attended, const std::string& output, int64_t hidden,
                const Node* after) {
  const std::string flat_shape = AddInt64Initializer(graph, output + "_flat_shape", {-1, hidden});
  graph.AddNode(MakeNode("Reshape", graph.UniqueName("attention_flatten"), {attended, flat_shape}, {output}), after,
                /*after=*/true);
}

void FinishAttentionOutput(Graph& graph, const PassContext& context, const AttentionMatch& match,
                           const std::string& attended, const Node* fused, FusionState* state) {
  std::string value = attended;
  const Node* at = fused;
  if (match.mask.zero_masked_rows) {
    // rows = max over the keys of Cast(cond) [B|1, 1, S, 1] -> [B|1, S, 1] (once per condition, shared
    // by the layers); the output times it.
    NodeChain chain(graph, fused);
    std::string& rows = state->kept_rows[match.mask.row_condition];
    if (rows.empty()) {
      const int64_t opset = context.OpsetVersion("");
      const std::string as_float = chain.Add("Cast", {match.mask.row_condition}, "mask_rows_float",
                                             {MakeIntAttribute("to", onnx::TensorProto::FLOAT)});
      const std::string any =
          opset >= 18 ? chain.Add("ReduceMax", {as_float, AddInt64Initializer(graph, "mask_rows_keys", {-1})},
                                  "mask_rows_any", {MakeIntAttribute("keepdims", 1)})
                      : chain.Add("ReduceMax", {as_float}, "mask_rows_any",
                                  {MakeIntsAttribute("axes", {-1}), MakeIntAttribute("keepdims", 1)});
      rows = opset >= 13
                 ? chain.Add("Squeeze", {any, AddInt64Initializer(graph, "mask_rows_head_axis", {1})}, "mask_rows")
                 : chain.Add("Squeeze", {any}, "mask_rows", {MakeIntsAttribute("axes", {1})});
    }
    value = match.out.flattened ? graph.UniqueName(match.out.output + "_guarded") : match.out.output;
    at = chain.AddNode(MakeNode("Mul", graph.UniqueName("zero_masked_rows"), {attended, rows}, {value}));
  }
  if (match.out.flattened) AddFlatten(graph, value, match.out.output, match.OutputWidth(), at);
}

}  // namespace onnxopt::attention
