// eliminate_dead_nodes: removes nodes none of whose outputs is read or is a graph output.
//
// Before:  A -> B -> (nothing)  ;  A -> C -> output       After:  A -> C -> output
// Works backwards with a worklist, so a chain of dead nodes goes in one run. Nodes of domains whose
// semantics onnxopt does not know are kept: a custom op may have side effects.
#include <deque>
#include <unordered_set>

#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

bool KnownDomain(absl::string_view domain) {
  return domain.empty() || domain == "ai.onnx.ml" || domain == "com.microsoft";
}

class EliminateDeadNodesPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_dead_nodes"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override {
    return "Remove nodes whose outputs nothing reads (not graph outputs, no consumers)";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    std::vector<Node*> nodes = graph.Nodes();
    std::deque<Node*> worklist(nodes.rbegin(), nodes.rend());
    std::unordered_set<Node*> queued(nodes.begin(), nodes.end());
    while (!worklist.empty()) {
      Node* node = worklist.front();
      worklist.pop_front();
      queued.erase(node);
      if (node->removed() || !IsDead(graph, *node)) continue;
      if (!KnownDomain(node->domain())) {
        context.Skip("unused node of an unknown domain may have side effects");
        continue;
      }
      std::vector<Node*> producers;
      for (int i = 0; i < node->input_size(); ++i) {
        if (Node* producer = graph.Producer(node->input(i))) producers.push_back(producer);
      }
      for (const std::string& implicit : node->implicit_inputs()) {
        if (Node* producer = graph.Producer(implicit)) producers.push_back(producer);
      }
      graph.RemoveNode(node);
      context.CountRewrite();
      for (Node* producer : producers) {
        if (queued.insert(producer).second) worklist.push_back(producer);
      }
    }
    return absl::OkStatus();
  }

 private:
  static bool IsDead(const Graph& graph, const Node& node) {
    for (int i = 0; i < node.output_size(); ++i) {
      const std::string& output = node.output(i);
      if (output.empty()) continue;
      if (graph.HasConsumers(output) || graph.IsGraphOutput(output)) return false;
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateDeadNodesPass() { return std::make_unique<EliminateDeadNodesPass>(); }

}  // namespace onnxopt
