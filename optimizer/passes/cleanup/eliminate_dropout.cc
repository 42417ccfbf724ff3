// eliminate_dropout: removes Dropout nodes that do nothing at inference.
//
// Before:  X -> Dropout(ratio, training_mode=false) -> Y -> Consumer     After:  X -> Consumer
// Dropout is a no-op in inference unless its training_mode input (opset 12+) is true or fed at run
// time. A used mask output keeps the node (the mask would have to be materialized).
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

// False if training_mode is absent or a constant false; nullopt-like "unknown" is reported as true.
bool MayBeTraining(const Graph& graph, const Node& node) {
  if (node.input_size() < 3 || node.input(2).empty()) return false;
  const onnx::TensorProto* flag = graph.Initializer(node.input(2));
  if (flag == nullptr || flag->data_type() != onnx::TensorProto::BOOL) return true;
  if (flag->int32_data_size() == 1) return flag->int32_data(0) != 0;
  if (flag->raw_data().size() == 1) return flag->raw_data()[0] != 0;
  return true;
}

class EliminateDropoutPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_dropout"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override { return "Remove Dropout nodes that are no-ops at inference"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* node : graph.Nodes()) {
      if (node->op_type() != "Dropout" || !node->domain().empty()) continue;
      if (node->input_size() < 1 || node->input(0).empty() || node->output_size() < 1) continue;
      if (MayBeTraining(graph, *node)) {
        context.Skip("training_mode is true or only known at run time");
        continue;
      }
      if (node->output_size() > 1 && !node->output(1).empty() &&
          (graph.HasConsumers(node->output(1)) || graph.IsGraphOutput(node->output(1)))) {
        context.Skip("mask output is used");
        continue;
      }
      BypassNode(graph, node, node->input(0), node->output(0), context);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateDropoutPass() { return std::make_unique<EliminateDropoutPass>(); }

}  // namespace onnxopt
