// eliminate_identity: removes Identity nodes.
//
// Before:  X -> Identity -> Y -> Consumer        After:  X -> Consumer
// When Y is a graph output, X's producer writes Y directly instead.
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class EliminateIdentityPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_identity"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override { return "Remove Identity nodes, rewiring their readers"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* node : graph.Nodes()) {
      if (node->op_type() != "Identity" || !node->domain().empty()) continue;
      if (node->input_size() != 1 || node->output_size() != 1 || node->input(0).empty()) continue;
      BypassNode(graph, node, node->input(0), node->output(0), context);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateIdentityPass() { return std::make_unique<EliminateIdentityPass>(); }

}  // namespace onnxopt
