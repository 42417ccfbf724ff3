// eliminate_dead_nodes: removes nodes none of whose outputs is read or is a graph output.
//
// Before:  A -> B -> (nothing)  ;  A -> C -> output       After:  A -> C -> output
// Works backwards with a worklist, so a chain of dead nodes goes in one run. Nodes of domains whose
// semantics onnxopt does not know are kept: a custom op may have side effects.
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

bool KnownDomain(absl::string_view domain) {
  return domain.empty() || domain == "ai.onnx.ml" || domain == "com.microsoft";
}

class EliminateDeadNodesPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_dead_nodes"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Remove nodes whose outputs nothing reads (not graph outputs, no consumers)";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    // One backward sweep; a producer of a removed node is looked at again only if the sweep had
    // passed it already, which a topological order never makes happen. (Queueing every node in a
    // deque and a node-based set cost more than the sweep itself at 45k nodes.)
    const std::vector<Node*> nodes = graph.Nodes();
    absl::flat_hash_map<const Node*, size_t> position;
    position.reserve(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) position[nodes[i]] = i;
    size_t next = nodes.size();  // the sweep looks at nodes[next - 1] next
    std::vector<Node*> again;    // producers the sweep had passed when their reader went
    absl::flat_hash_set<const Node*> queued_again;
    auto look_at = [&](Node* node) {
      if (node->removed() || !IsDead(graph, *node)) return;
      if (!KnownDomain(node->domain())) {
        context.Skip("unused node of an unknown domain may have side effects");
        return;
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
        auto at = position.find(producer);
        if (at != position.end() && at->second < next) continue;  // the sweep gets to it
        if (queued_again.insert(producer).second) again.push_back(producer);
      }
    };
    while (next > 0) {
      --next;
      look_at(nodes[next]);
    }
    while (!again.empty()) {
      Node* node = again.back();
      again.pop_back();
      queued_again.erase(node);
      look_at(node);
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
