// canonicalize_summed_masks: scores that get two masks added one after the other (transformers 4.x's CLIP
// text model: `w.view(B, N, S, T) + causal_attention_mask`, then `+ attention_mask`; a causal bias then a
// padding bias) become scores plus one mask, the form the attention fusion reads as attention_bias.
//
// Before:  p = Softmax(Add(Add(x, a), b))          (either operand order in each Add)
// After:   p = Softmax(Add(x, Add(a, b)))
// Checked: x is the scores, Q·K^T (a MatMul of two computed values, possibly scaled by a scalar Mul or
// Div); neither a nor b is computed from x; the inner Add is read only by the outer one, the outer only
// by the Softmax. Exact for masks of 0 and large negative values (0 + 0, m + 0 and x + m round the same
// either way; two such masks sum to -inf, as x + m + m does); a float bias may round its last bit
// differently, which the fused kernel, adding one bias, does anyway.
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
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

// True if `value` is provably not computed from `from`: a walk up its producers (at most 256 nodes)
// that never meets it.
bool Independent(const Graph& graph, const std::string& value, const std::string& from) {
  std::vector<std::string> pending = {value};
  absl::flat_hash_set<std::string> seen;
  while (!pending.empty()) {
    const std::string current = pending.back();
    pending.pop_back();
    if (current == from) return false;
    if (current.empty() || !seen.insert(current).second) continue;
    if (seen.size() > 256) return false;
    if (Node* producer = graph.Producer(current)) {
      for (const std::string& input : producer->proto().input()) pending.push_back(input);
    }
  }
  return true;
}

class CanonicalizeSummedMasksPass final : public Pass {
 public:
  absl::string_view name() const override { return "canonicalize_summed_masks"; }
  absl::string_view description() const override {
    return "Scores with two masks added in turn (CLIP's causal, then padding) as scores plus one summed mask";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* softmax : graph.Nodes()) {
      if (softmax->removed() || softmax->op_type() != "Softmax" || !softmax->domain().empty()) continue;
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
        const int x_side = IsScores(graph, inner->input(0)) ? 0 : IsScores(graph, inner->input(1)) ? 1 : -1;
        if (x_side < 0) continue;
        const std::string x = inner->input(x_side), a = inner->input(1 - x_side);
        if (!Independent(graph, a, x) || !Independent(graph, b, x)) continue;
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
