// fuse_reshape_chains: collapses chains of shape-only ops.
//
// Before:  X -> Reshape(s1) -> Reshape(s2) -> Y            After:  X -> Reshape(s2) -> Y
//          X -> Unsqueeze(a1) -> Unsqueeze(a2) -> Y                X -> Unsqueeze(a) -> Y
//          X -> Squeeze(a1) -> Squeeze(a2) -> Y                    X -> Squeeze(a) -> Y
//          X -> Unsqueeze(a) -> Squeeze(a) -> Y                    X -> Y
// Reshape: the second shape must be a constant without 0 (a 0 copies a dim of the first's output).
// Unsqueeze/Squeeze merging needs constant, non-negative axes (opset 13+ inputs or older attributes);
// Squeeze without axes is left alone. The first node stays if something else reads its output.
#include <algorithm>
#include <set>

#include "optimizer/passes/bypass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

std::optional<std::vector<int64_t>> Axes(const Graph& graph, const Node& node, int64_t opset) {
  if (opset >= 13) {
    if (node.input_size() < 2 || node.input(1).empty()) return std::nullopt;
    return ConstantInts(graph, node.input(1));
  }
  const onnx::AttributeProto* attribute = node.FindAttribute("axes");
  if (attribute == nullptr) return std::nullopt;
  return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
}

bool AllNonNegative(const std::vector<int64_t>& values) {
  return std::all_of(values.begin(), values.end(), [](int64_t v) { return v >= 0; });
}

// Axes of Unsqueeze(a1) then Unsqueeze(a2), as one Unsqueeze on the original input: a2 indexes the
// output; each a1 axis shifts right past the a2 axes at or before its new position.
std::vector<int64_t> ComposeUnsqueeze(std::vector<int64_t> first, const std::vector<int64_t>& second) {
  std::sort(first.begin(), first.end());
  std::set<int64_t> result(second.begin(), second.end());
  // Positions of the output not taken by `second`, in order, correspond to the first's output dims.
  int64_t rank = static_cast<int64_t>(first.size() + second.size()) + 64;  // enough positions
  std::vector<int64_t> free_positions;
  for (int64_t p = 0; p < rank; ++p) {
    if (result.count(p) == 0) free_positions.push_back(p);
  }
  for (int64_t axis : first) {
    if (axis >= static_cast<int64_t>(free_positions.size())) return {};  // invalid axes: no rewrite
    result.insert(free_positions[static_cast<size_t>(axis)]);
  }
  return {result.begin(), result.end()};
}

class FuseReshapeChainsPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_reshape_chains"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Collapse Reshape->Reshape, Unsqueeze->Unsqueeze, Squeeze->Squeeze and Unsqueeze->Squeeze chains";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const int64_t opset = context.OpsetVersion("");
    for (Node* second : graph.Nodes()) {
      if (second->removed() || !second->domain().empty() || second->input_size() < 1) continue;
      Node* first = graph.Producer(second->input(0));
      if (first == nullptr || first->removed() || !first->domain().empty()) continue;
      const absl::string_view a = first->op_type();
      const absl::string_view b = second->op_type();
      const std::string middle = first->output(0);
      bool rewritten = false;
      if (a == "Reshape" && b == "Reshape") {
        auto shape = ConstantInts(graph, second->input(1));
        if (!shape || std::find(shape->begin(), shape->end(), 0) != shape->end()) {
          context.Skip("second Reshape's shape is not a constant without 0");
          continue;
        }
        graph.SetInput(second, 0, first->input(0));
        rewritten = true;
      } else if ((a == "Unsqueeze" && b == "Unsqueeze") || (a == "Squeeze" && b == "Squeeze") ||
                 (a == "Unsqueeze" && b == "Squeeze")) {
        auto first_axes = Axes(graph, *first, opset);
        auto second_axes = Axes(graph, *second, opset);
        if (!first_axes || !second_axes || !AllNonNegative(*first_axes) || !AllNonNegative(*second_axes)) {
          context.Skip("axes are not constant and non-negative");
          continue;
        }
        if (a == "Unsqueeze" && b == "Squeeze") {
          std::vector<int64_t> x = *first_axes, y = *second_axes;
          std::sort(x.begin(), x.end());
          std::sort(y.begin(), y.end());
          if (x != y) continue;
          rewritten = BypassNode(graph, second, first->input(0), second->output(0), context);
          if (rewritten) context.CountRewrite(-1);  // BypassNode counted it; counted once below
        } else {
          std::vector<int64_t> merged;
          if (a == "Unsqueeze") {
            merged = ComposeUnsqueeze(*first_axes, *second_axes);
            if (merged.empty()) continue;
          } else {  // Squeeze then Squeeze: map the second's axes back to the input's numbering
            std::vector<int64_t> removed = *first_axes;
            std::sort(removed.begin(), removed.end());
            merged = removed;
            for (int64_t axis : *second_axes) {
              int64_t original = axis;
              for (int64_t r : removed) {
                if (r <= original) ++original;
              }
              merged.push_back(original);
            }
            std::sort(merged.begin(), merged.end());
          }
          onnx::NodeProto fused = second->proto();
          fused.set_input(0, first->input(0));
          if (opset >= 13) {
            const std::string axes = graph.UniqueName(second->output(0) + "_axes");
            graph.AddInitializer(MakeInt64Tensor(axes, merged));
            fused.set_input(1, axes);
          } else {
            for (auto& attribute : *fused.mutable_attribute()) {
              if (attribute.name() != "axes") continue;
              attribute.clear_ints();
              for (int64_t axis : merged) attribute.add_ints(axis);
            }
          }
          graph.RemoveNode(second);
          graph.AddNode(std::move(fused), first, /*after=*/true);
          rewritten = true;
        }
      }
      if (!rewritten) continue;
      context.CountRewrite();
      if (!graph.HasConsumers(middle) && !graph.IsGraphOutput(middle)) graph.RemoveNode(first);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseReshapeChainsPass() { return std::make_unique<FuseReshapeChainsPass>(); }

}  // namespace onnxopt
