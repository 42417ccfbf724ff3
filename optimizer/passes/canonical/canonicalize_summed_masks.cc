// canonicalize_summed_masks: the terms added to attention scores, brought to the one form the attention
// fusion reads, scores plus one term (its attention_bias). Two rewrites, the first before the second:
//
// 1. The scale after a sum (ESPnet's, WeNet's and NeMo's relative-position attention:
//    `(matrix_ac + matrix_bd) / sqrt(d_k)`, the position term bd beside Q*K^T) goes on each term.
//    Before:  p = Softmax([Add(] Div(Add(x, b), c) [, m)])        (or Mul by c; m: a mask added after)
//    After:   p = Softmax([Add(] Add(Div(x, c), Div(b, c)) [, m)]) (b / c folded where b is constant)
//    Checked: c is a constant scalar; x is the scores (below) and b is not computed from them; the sum
//    and the scaled sum are read only on this way. Each term rounds once more than their sum did.
// 2. Two masks added one after the other (transformers 4.x's CLIP text model: `w.view(B, N, S, T) +
//    causal_attention_mask`, then `+ attention_mask`; a causal bias then a padding bias), or a term and a
//    mask (the position term of 1 and the padding): scores plus one summed mask.
//    Before:  p = Softmax(Add(Add(x, a), b))          (either operand order in each Add)
//    After:   p = Softmax(Add(x, Add(a, b)))
//    Checked: neither a nor b is computed from x; the inner Add is read only by the outer one, the outer
//    only by the Softmax. Exact for masks of 0 and large negative values (0 + 0, m + 0 and x + m round
//    the same either way; two such masks sum to -inf, as x + m + m does); a float bias may round its
//    last bit differently, which the fused kernel, adding one bias, does anyway.
// The scores x: Q*K^T, a MatMul of two values nothing folds to a constant (possibly scaled by a scalar
// Mul or Div). Where both terms of a sum are such MatMuls (WeNet's q_u*K^T + q_v*P^T, without a shift),
// x is the one whose operands are computed from a common value (Q and K from the layer's input; the
// positions P come from a table).
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// True if `value` is the scores: a MatMul of two values nothing folds to a constant, or such a MatMul
// scaled by a scalar.
bool IsScores(const Graph& graph, const std::string& value) {
  Node* producer = graph.Producer(value);
  if (producer == nullptr || !producer->domain().empty()) return false;
  if ((producer->op_type() == "Mul" || producer->op_type() == "Div") && ScalarScale(graph, producer)) {
    producer = ProducerWithOp(graph, producer->input(0), "MatMul");
    if (producer == nullptr) return false;
  }
  return producer->op_type() == "MatMul" && producer->input_size() == 2 && !ConstantTensor(graph, producer->input(0)) &&
         !ConstantTensor(graph, producer->input(1));
}

// Positions of the graph's nodes in a topological order, taken when the pass starts.
using Positions = absl::flat_hash_map<const Node*, size_t>;

// True if `value` is provably not computed from `from`: a walk up its producers that never meets it.
// Nodes placed before `from`'s producer in `order` cannot read it and end the walk there, so the walk
// stays within the layer (at most 4096 nodes); nodes this pass added are walked through.
bool Independent(const Graph& graph, const Positions& order, const std::string& value, const std::string& from) {
  const Node* from_producer = graph.Producer(from);
  const auto from_at = from_producer != nullptr ? order.find(from_producer) : order.end();
  std::vector<std::string> pending = {value};
  absl::flat_hash_set<std::string> seen;
  while (!pending.empty()) {
    const std::string current = pending.back();
    pending.pop_back();
    if (current == from) return false;
    if (current.empty() || !seen.insert(current).second) continue;
    if (seen.size() > 4096) return false;
    Node* producer = graph.Producer(current);
    if (producer == nullptr) continue;
    if (const auto at = order.find(producer); from_at != order.end() && at != order.end() && at->second < from_at->second) {
      continue;
    }
    for (const std::string& input : producer->proto().input()) pending.push_back(input);
  }
  return true;
}

// The values `value` is computed from, up to `limit` of them, not through a Shape (a shape read is no
// data) and not counting constants.
absl::flat_hash_set<std::string> Sources(const Graph& graph, const std::string& value, size_t limit) {
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> pending = {value};
  while (!pending.empty() && seen.size() < limit) {
    const std::string current = pending.back();
    pending.pop_back();
    if (current.empty() || ConstantTensor(graph, current) != nullptr || !seen.insert(current).second) continue;
    Node* producer = graph.Producer(current);
    if (producer == nullptr || producer->op_type() == "Shape") continue;
    for (const std::string& input : producer->proto().input()) pending.push_back(input);
  }
  return seen;
}

// True if the two operands of the MatMul behind the scores `value` are computed from a common value.
bool OperandsShareASource(const Graph& graph, const std::string& value) {
  Node* matmul = graph.Producer(value);
  if (matmul != nullptr && matmul->op_type() != "MatMul") matmul = ProducerWithOp(graph, matmul->input(0), "MatMul");
  if (matmul == nullptr) return false;
  const absl::flat_hash_set<std::string> left = Sources(graph, matmul->input(0), 64);
  for (const std::string& source : Sources(graph, matmul->input(1), 64)) {
    if (left.count(source) > 0) return true;
  }
  return false;
}

// Which operand of `add` is the scores: 0, 1, or -1 for neither.
int ScoresSide(const Graph& graph, const Node& add) {
  const bool first = IsScores(graph, add.input(0)), second = IsScores(graph, add.input(1));
  if (first && second && !OperandsShareASource(graph, add.input(0)) && OperandsShareASource(graph, add.input(1))) {
    return 1;
  }
  return first ? 0 : second ? 1 : -1;
}

// Rewrite 1 on the scaled sum `scaled` = Div|Mul(Add(x, b), c), read by `reader` only; true if done.
bool DistributeScale(Graph& graph, const Positions& order, Node* scaled, const Node* reader, PassContext& context) {
  const std::optional<std::pair<float, std::string>> scale = ScalarScale(graph, scaled);
  if (!scale || SoleConsumer(graph, scaled->output(0)) != reader || graph.IsGraphOutput(scaled->output(0))) {
    return false;
  }
  Node* sum = ProducerWithOp(graph, scale->second, "Add");
  if (sum == nullptr || sum->input_size() != 2 || SoleConsumer(graph, sum->output(0)) != scaled ||
      graph.IsGraphOutput(sum->output(0))) {
    return false;
  }
  const int x_side = ScoresSide(graph, *sum);
  if (x_side < 0) return false;
  const std::string x = sum->input(x_side), b = sum->input(1 - x_side);
  if (!Independent(graph, order, b, x)) return false;
  // Div by c stays a Div (the same rounding as the original's); Mul by c a Mul.
  const std::string op(scaled->op_type());
  const std::string c = scaled->input(op == "Div" || scaled->input(0) == scale->second ? 1 : 0);
  const std::string output = scaled->output(0);
  const std::string name = scaled->name().empty() ? "scaled_scores" : scaled->name();
  NodeChain chain(graph, scaled);
  const std::string scaled_x = chain.Add(op, {x, c}, name + "_scores");
  std::string scaled_b;
  const std::optional<std::vector<float>> constant = ConstantFloats(graph, b);
  if (constant && constant->size() <= 4096) {
    const float c_value = *ConstantScalarFloat(graph, c);
    std::vector<float> values = *constant;
    for (float& v : values) v = op == "Div" ? v / c_value : v * c_value;
    const onnx::TensorProto& tensor = *ConstantTensor(graph, b);
    scaled_b = graph.UniqueName(name + "_term");
    graph.AddInitializer(MakeFloatTensor(scaled_b, {tensor.dims().begin(), tensor.dims().end()}, values));
  } else {
    scaled_b = chain.Add(op, {b, c}, name + "_term");
  }
  graph.RemoveNode(scaled);
  graph.RemoveNode(sum);
  chain.AddNode(MakeNode("Add", graph.UniqueName(name + "_sum"), {scaled_x, scaled_b}, {output}));
  context.CountRewrite();
  return true;
}

class CanonicalizeSummedMasksPass final : public Pass {
 public:
  absl::string_view name() const override { return "canonicalize_summed_masks"; }
  absl::string_view description() const override {
    return "Scores with terms added in turn (CLIP's causal mask, then padding; a scale after a position term's sum) "
           "as scores plus one summed term";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    Positions order;  // Nodes() is topological when a pass starts (the pass manager's checkpoint)
    for (const Node* node : graph.Nodes()) order.emplace(node, order.size());
    for (Node* softmax : graph.Nodes()) {
      if (softmax->removed() || softmax->op_type() != "Softmax" || !softmax->domain().empty()) continue;
      if (!DistributeScale(graph, order, graph.Producer(softmax->input(0)), softmax, context)) {
        if (Node* masked = ProducerWithOp(graph, softmax->input(0), "Add"); masked != nullptr && masked->input_size() == 2) {
          for (int side = 0; side < 2; ++side) {
            if (DistributeScale(graph, order, graph.Producer(masked->input(side)), masked, context)) break;
          }
        }
      }
      Node* outer = ProducerWithOp(graph, softmax->input(0), "Add");
      if (outer == nullptr || outer->input_size() != 2 || SoleConsumer(graph, outer->output(0)) != softmax ||
          graph.IsGraphOutput(outer->output(0))) {
        continue;
      }
      for (int side = 0; side < 2; ++side) {
        Node* inner = ProducerWithOp(graph, outer->input(side), "Add");
        if (inner == nullptr || inner->input_size() != 2 || SoleConsumer(graph, inner->output(0)) != outer ||
            graph.IsGraphOutput(inner->output(0))) {
          continue;
        }
        const std::string& b = outer->input(1 - side);
        const int x_side = ScoresSide(graph, *inner);
        if (x_side < 0) continue;
        const std::string x = inner->input(x_side), a = inner->input(1 - x_side);
        if (!Independent(graph, order, a, x) || !Independent(graph, order, b, x)) continue;
        // inner becomes a + b (placed where b is known), outer x + (a + b).
        const std::string summed = graph.UniqueName(inner->output(0) + "_masks");
        onnx::NodeProto sum = MakeNode("Add", inner->name().empty() ? "" : inner->name() + "_masks", {a, b}, {summed});
        graph.AddNode(std::move(sum), outer, /*after=*/false);
        graph.SetInput(outer, 0, x);
        graph.SetInput(outer, 1, summed);
        graph.RemoveNode(inner);
        context.CountRewrite();
        break;
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeSummedMasksPass() { return std::make_unique<CanonicalizeSummedMasksPass>(); }

}  // namespace onnxopt
