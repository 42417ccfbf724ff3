// eliminate_noop_ops: removes nodes that return their input unchanged.
//
// Before:  X -> Cast(to = type of X) -> Y -> Consumer        After:  X -> Consumer
// Also: Transpose with the identity perm; Reshape or Expand whose output shape is the input's (same
// numbers or the same symbolic names, from shape inference); Slice over the full range with step 1 (ends
// INT_MAX-like, or tf2onnx's 1e9 past the axis' known size);
// Pad with all pads 0; Concat of one input; Split into one output.
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

std::vector<int64_t> AttributeInts(const Node& node, const char* name) {
  const onnx::AttributeProto* attribute = node.FindAttribute(name);
  if (attribute == nullptr) return {};
  return {attribute->ints().begin(), attribute->ints().end()};
}

// Whether a node returns its input unchanged; a failure's reason says why that is not known, when the
// answer depends on missing information.
MatchResult<Matched> MatchNoop(const Graph& graph, const Node& node, const ShapeInfo& shapes, int64_t opset) {
  const absl::string_view op = node.op_type();
  if (op == "Cast") {
    const auto from = shapes.ElementType(node.input(0));
    if (!from) return Fail("Cast: input type unknown");
    if (*from != node.GetAttributeInt("to", -1)) return Fail();
    return Matched{};
  }
  if (op == "Transpose") {
    std::vector<int64_t> perm = AttributeInts(node, "perm");
    if (perm.empty()) {  // default: reverse the dims, a no-op only for rank <= 1
      const auto rank = shapes.Rank(node.input(0));
      if (!rank || *rank > 1) return Fail();
      return Matched{};
    }
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] != static_cast<int64_t>(i)) return Fail();
    }
    return Matched{};
  }
  if (op == "Reshape" || op == "Expand") {
    if (!shapes.SameShape(node.input(0), node.output(0))) {
      return Fail(absl::StrCat(op, ": output shape not known to equal the input's"));
    }
    return Matched{};
  }
  if (op == "Concat" && node.input_size() == 1) return Matched{};
  if (op == "Split" && node.output_size() == 1) return Matched{};
  if (op == "Pad") {
    std::vector<int64_t> pads = opset >= 11 ? std::vector<int64_t>() : AttributeInts(node, "pads");
    if (opset >= 11) {
      auto constant = node.input_size() > 1 ? ConstantInts(graph, node.input(1)) : std::nullopt;
      if (!constant) return Fail();
      pads = *constant;
    }
    if (pads.empty()) return Fail();
    for (int64_t pad : pads) {
      if (pad != 0) return Fail();
    }
    return Matched{};
  }
  if (op == "Slice" && opset >= 10) {
    const std::optional<SliceSpec> slice = ParseSlice(graph, node);
    if (!slice || !slice->starts || !slice->ends) return Fail();
    for (int64_t start : *slice->starts) {
      if (start != 0) return Fail();
    }
    const std::optional<int> rank = shapes.Rank(node.input(0));
    for (size_t i = 0; i < slice->ends->size(); ++i) {
      const int64_t end = (*slice->ends)[i];
      if (end >= std::numeric_limits<int32_t>::max()) continue;  // INT_MAX-style "to the end"
      // Or tf2onnx's StridedSlice sentinel 1e9 past the axis' known size. An end at the axis' exact size
      // stays: such slices (`cos[:S]`) are what the rotary matchers read.
      constexpr int64_t kToTheEnd = 1000000000;
      if (end < kToTheEnd) return Fail();
      const int64_t axis = rank && slice->axes[i] < 0 ? slice->axes[i] + *rank : slice->axes[i];
      const std::optional<int64_t> size = shapes.DimValue(node.input(0), static_cast<int>(axis));
      if (!size || end < *size) return Fail();
    }
    for (int64_t step : slice->steps) {
      if (step != 1) return Fail();
    }
    return Matched{};
  }
  return Fail();
}

class EliminateNoopOpsPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "eliminate_noop_ops"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Remove Cast/Transpose/Reshape/Expand/Slice/Pad/Concat/Split nodes that return their input unchanged";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    for (Node* node : graph.Nodes()) {
      if (!node->domain().empty() || node->input_size() < 1 || node->input(0).empty()) continue;
      if (node->output_size() < 1 || node->output(0).empty()) continue;
      MatchResult<Matched> noop = MatchNoop(graph, *node, shapes, context.OpsetVersion(""));
      if (!noop) {
        if (!noop.reason().empty()) context.Skip(noop.reason());
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
