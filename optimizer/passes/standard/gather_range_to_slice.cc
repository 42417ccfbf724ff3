// gather_range_to_slice: Gather(data, Range(start, limit, delta)) becomes a Slice on the gather axis
// (ONNX Runtime's Gather-to-Slice fusion; XLNet's `index_select(x, d, arange(k))`), and so does a
// Gather over constant indices that count in steps (what constant folding makes of a static Range,
// so the order of the two passes does not matter).
//
// Before:  start, limit, delta -> Range -> idx ; Gather(data, idx, axis=a) -> Y
//          Gather(data, [s, s+d, ..., s+(k-1)d], axis=a) -> Y
// After:   Slice(data, starts=[start], ends=[limit], axes=[a], steps=[delta]) -> Y
// It fires only where both give the same result on every input the original accepts:
// - start and delta are constant integer scalars, start >= 0, delta != 0 (Gather's negative indices
//   wrap around, Slice's negative bounds mean something else);
// - delta > 0: limit is a constant >= 0, or a size (Shape/Size, or Gather/Slice/Cast of one, or one
//   divided by a positive constant), so it cannot be negative; an empty range gives an empty slice;
// - delta < 0: limit is a constant >= -1 (-1 becomes "before the first element").
// - constant indices: 1-D, non-negative, an arithmetic progression with a step other than 0 (one index:
//   step 1); a scalar index drops the axis, which no Slice does.
// A Range read elsewhere stays for its other readers.
#include <limits>
#include <tuple>

#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

std::optional<int64_t> ScalarInt(const Graph& graph, const std::string& value) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  if (tensor == nullptr || tensor->dims_size() > 1 || (tensor->dims_size() == 1 && tensor->dims(0) != 1)) {
    return std::nullopt;
  }
  auto ints = TensorInts(*tensor);
  if (!ints || ints->size() != 1) return std::nullopt;
  return (*ints)[0];
}

// True if `value` is a tensor size by construction (never negative).
bool IsSize(const Graph& graph, const std::string& value, int depth = 0) {
  const Node* producer = graph.Producer(value);
  if (producer == nullptr || depth > 8 || !producer->domain().empty()) return false;
  const absl::string_view op = producer->op_type();
  if (op == "Shape" || op == "Size") return true;
  if (op == "Gather" || op == "Slice" || op == "Squeeze" || op == "Unsqueeze" || op == "Reshape" || op == "Cast" ||
      op == "Identity") {
    return IsSize(graph, producer->input(0), depth + 1);
  }
  if (op == "Div" && producer->input_size() == 2) {  // size // positive constant
    auto divisor = ConstantInts(graph, producer->input(1));
    return divisor && divisor->size() == 1 && (*divisor)[0] > 0 && IsSize(graph, producer->input(0), depth + 1);
  }
  return false;
}

// Constant 1-D indices as (first, step, last) if they count from >= 0 in one non-zero step.
std::optional<std::tuple<int64_t, int64_t, int64_t>> Progression(const Graph& graph, const std::string& value) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  if (tensor == nullptr || tensor->dims_size() != 1 || tensor->dims(0) < 1) return std::nullopt;
  auto ints = TensorInts(*tensor);
  if (!ints || ints->empty()) return std::nullopt;
  // Non-negative and below the largest int64 first, so the arithmetic below cannot overflow.
  for (int64_t index : *ints) {
    if (index < 0 || index == std::numeric_limits<int64_t>::max()) return std::nullopt;
  }
  const int64_t step = ints->size() == 1 ? 1 : (*ints)[1] - (*ints)[0];
  if (step == 0) return std::nullopt;
  for (size_t i = 1; i < ints->size(); ++i) {
    if ((*ints)[i] - (*ints)[i - 1] != step) return std::nullopt;
  }
  return std::make_tuple(ints->front(), step, ints->back());
}

class GatherRangeToSlicePass final : public Pass {
 public:
  absl::string_view name() const override { return "gather_range_to_slice"; }
  absl::string_view description() const override {
    return "Turn Gather over a Range of indices into a Slice on the gather axis";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const int64_t opset = context.OpsetVersion("");
    if (opset < 11) return absl::OkStatus();  // Range does not exist before opset 11
    for (Node* gather : graph.Nodes()) {
      if (gather->op_type() != "Gather" || !gather->domain().empty() || gather->input_size() != 2) continue;
      if (auto progression = Progression(graph, gather->input(1))) {
        const auto [first, step, last] = *progression;
        // Exclusive end one step past the last index; below 0 means "before the first element".
        const int64_t end = step > 0 ? last + 1 : (last == 0 ? std::numeric_limits<int64_t>::min() : last - 1);
        const std::string ends = graph.UniqueName(gather->output(0) + "_ends");
        graph.AddInitializer(MakeInt64Tensor(ends, {end}));
        ReplaceWithSlice(graph, gather, first, ends, step, gather);
        context.CountRewrite();
        continue;
      }
      Node* range = graph.Producer(gather->input(1));
      if (range == nullptr || range->op_type() != "Range" || !range->domain().empty() || range->input_size() != 3) {
        continue;
      }
      const std::optional<int64_t> start = ScalarInt(graph, range->input(0));
      const std::optional<int64_t> delta = ScalarInt(graph, range->input(2));
      const std::optional<int64_t> limit = ScalarInt(graph, range->input(1));
      if (!start || !delta) {
        context.Skip("Range start or delta is not a constant integer");
        continue;
      }
      if (*start < 0 || *delta == 0) {
        context.Skip("Range starts below 0 or has delta 0");
        continue;
      }
      int64_t end = 0;
      bool dynamic_end = false;
      if (*delta > 0) {
        if (limit && *limit >= 0) {
          end = *limit;
        } else if (!limit && IsSize(graph, range->input(1))) {
          dynamic_end = true;
        } else {
          context.Skip("Range limit may be negative");
          continue;
        }
      } else {
        if (!limit || *limit < -1) {
          context.Skip("descending Range needs a constant limit >= -1");
          continue;
        }
        end = *limit == -1 ? std::numeric_limits<int64_t>::min() : *limit;
      }
      const auto* type = ConstantTensor(graph, range->input(0));
      if (dynamic_end && type->data_type() != onnx::TensorProto::INT64) {
        context.Skip("dynamic Range limit is not int64");
        continue;
      }
      std::string ends;
      if (dynamic_end) {  // Slice wants 1-D bounds: unsqueeze the scalar limit
        ends = graph.UniqueName(gather->output(0) + "_ends");
        onnx::NodeProto unsqueeze = MakeNode("Unsqueeze", ends, {range->input(1)}, {ends});
        if (opset >= 13) {
          const std::string axes = graph.UniqueName("unsqueeze_axes");
          graph.AddInitializer(MakeInt64Tensor(axes, {0}));
          unsqueeze.add_input(axes);
        } else {
          *unsqueeze.add_attribute() = MakeIntsAttribute("axes", {0});
        }
        graph.AddNode(std::move(unsqueeze), gather, /*after=*/false);
      } else {
        ends = graph.UniqueName(gather->output(0) + "_ends");
        graph.AddInitializer(MakeInt64Tensor(ends, {end}));
      }
      const std::string range_output = range->output(0);
      ReplaceWithSlice(graph, gather, *start, ends, *delta, range);
      if (!graph.HasConsumers(range_output) && !graph.IsGraphOutput(range_output)) graph.RemoveNode(range);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }

 private:
  // Slice(data, [start], ends, [axis], [step]) in place of `gather`, placed after `anchor` (the Range,
  // or the Gather itself).
  static void ReplaceWithSlice(Graph& graph, Node* gather, int64_t start, const std::string& ends, int64_t step,
                               const Node* anchor) {
    const int64_t axis = gather->GetAttributeInt("axis", 0);
    const std::string starts = graph.UniqueName(gather->output(0) + "_starts");
    const std::string axes = graph.UniqueName(gather->output(0) + "_axes");
    const std::string steps = graph.UniqueName(gather->output(0) + "_steps");
    graph.AddInitializer(MakeInt64Tensor(starts, {start}));
    graph.AddInitializer(MakeInt64Tensor(axes, {axis}));
    graph.AddInitializer(MakeInt64Tensor(steps, {step}));
    onnx::NodeProto slice =
        MakeNode("Slice", gather->name().empty() ? graph.UniqueName("slice") : gather->name() + "_as_slice",
                 {gather->input(0), starts, ends, axes, steps}, {gather->output(0)});
    graph.RemoveNode(gather);  // a removed node keeps its place, so it can still be the anchor
    graph.AddNode(std::move(slice), anchor, /*after=*/true);
  }
};

}  // namespace

std::unique_ptr<Pass> MakeGatherRangeToSlicePass() { return std::make_unique<GatherRangeToSlicePass>(); }

}  // namespace onnxopt
