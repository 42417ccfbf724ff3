// eliminate_noop_ops: removes nodes that return their input unchanged.
//
// Before:  X -> Cast(to = type of X) -> Y -> Consumer        After:  X -> Consumer
// Also: Transpose with the identity perm; Reshape or Expand whose output shape is the input's (same
// numbers or the same symbolic names, from shape inference); Slice over the full range with step 1;
// Pad with all pads 0; Concat of one input; Split into one output.
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

std::vector<int64_t> AttributeInts(const Node& node, const char* name) {
  const onnx::AttributeProto* attribute = node.FindAttribute(name);
  if (attribute == nullptr) return {};
  return {attribute->ints().begin(), attribute->ints().end()};
}

// Whether a node is a no-op; `reason` says why not when the answer depends on missing information.
bool IsNoop(const Graph& graph, const Node& node, const PassContext& context, std::string* reason) {
  const absl::string_view op = node.op_type();
  const ShapeInfo* shapes = context.shapes();
  const int64_t opset = context.OpsetVersion("");
  if (op == "Cast") {
    const auto from = shapes ? shapes->ElementType(node.input(0)) : std::nullopt;
    if (!from) *reason = "Cast: input type unknown";
    return from && *from == node.GetAttributeInt("to", -1);
  }
  if (op == "Transpose") {
    std::vector<int64_t> perm = AttributeInts(node, "perm");
    if (perm.empty()) {  // default: reverse the dims, a no-op only for rank <= 1
      const auto rank = shapes ? shapes->Rank(node.input(0)) : std::nullopt;
      return rank && *rank <= 1;
    }
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] != static_cast<int64_t>(i)) return false;
    }
    return true;
  }
  if (op == "Reshape" || op == "Expand") {
    if (shapes == nullptr || !shapes->SameShape(node.input(0), node.output(0))) {
      *reason = absl::StrCat(op, ": output shape not known to equal the input's");
      return false;
    }
    return true;
  }
  if (op == "Concat") return node.input_size() == 1;
  if (op == "Split") return node.output_size() == 1;
  if (op == "Pad") {
    std::vector<int64_t> pads = opset >= 11 ? std::vector<int64_t>() : AttributeInts(node, "pads");
    if (opset >= 11) {
      auto constant = node.input_size() > 1 ? ConstantInts(graph, node.input(1)) : std::nullopt;
      if (!constant) return false;
      pads = *constant;
    }
    if (pads.empty()) return false;
    for (int64_t pad : pads) {
      if (pad != 0) return false;
    }
    return true;
  }
  if (op == "Slice" && opset >= 10) {
    if (node.input_size() < 3) return false;
    auto starts = ConstantInts(graph, node.input(1));
    auto ends = ConstantInts(graph, node.input(2));
    auto steps = node.input_size() > 4 && !node.input(4).empty() ? ConstantInts(graph, node.input(4))
                                                                  : std::optional<std::vector<int64_t>>(std::vector<int64_t>());
    if (!starts || !ends || !steps) return false;
    for (int64_t start : *starts) {
      if (start != 0) return false;
    }
    for (int64_t end : *ends) {
      if (end < std::numeric_limits<int32_t>::max()) return false;  // INT_MAX-style "to the end"
    }
    for (int64_t step : *steps) {
      if (step != 1) return false;
    }
    return true;
  }
  return false;
}

class EliminateNoopOpsPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_noop_ops"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override {
    return "Remove Cast/Transpose/Reshape/Expand/Slice/Pad/Concat/Split nodes that return their input unchanged";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* node : graph.Nodes()) {
      if (!node->domain().empty() || node->input_size() < 1 || node->input(0).empty()) continue;
      if (node->output_size() < 1 || node->output(0).empty()) continue;
      std::string reason;
      if (!IsNoop(graph, *node, context, &reason)) {
        if (!reason.empty()) context.Skip(reason);
        continue;
      }
      BypassNode(graph, node, node->input(0), node->output(0), context);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateNoopOpsPass() { return std::make_unique<EliminateNoopOpsPass>(); }

}  // namespace onnxopt
