#include "optimizer/passes/match.h"

#include <algorithm>
#include <cmath>

namespace onnxopt {
namespace {

bool StepFits(const Graph& graph, const Step& step, const Node& node, int followed) {
  return followed < node.input_size() && (step.check == nullptr || step.check(graph, node, followed));
}

// Depth-first over the operand orders of kAnyInput steps; `path` holds the steps matched so far.
bool MatchFrom(const Graph& graph, const std::string& value, const std::vector<Step>& steps, size_t index,
               const PathCheck& accept, PathMatch* path) {
  if (index == steps.size()) {
    path->end = value;
    return accept == nullptr || accept(*path);
  }
  const Step& step = steps[index];
  Node* node = graph.Producer(value);
  if (node == nullptr || node->op_type() != step.op || node->domain() != step.domain) return false;
  const int first = step.input == kAnyInput ? 0 : step.input;
  const int last = step.input == kAnyInput ? node->input_size() - 1 : step.input;
  for (int followed = first; followed <= last; ++followed) {
    if (!StepFits(graph, step, *node, followed) || node->input(followed).empty()) continue;
    path->nodes.push_back(node);
    path->followed.push_back(followed);
    if (MatchFrom(graph, node->input(followed), steps, index + 1, accept, path)) return true;
    path->nodes.pop_back();
    path->followed.pop_back();
  }
  return false;
}

}  // namespace

std::optional<PathMatch> MatchPath(const Graph& graph, const std::string& value, const std::vector<Step>& steps,
                                   const PathCheck& accept) {
  PathMatch path;
  path.nodes.reserve(steps.size());
  path.followed.reserve(steps.size());
  if (!MatchFrom(graph, value, steps, 0, accept, &path)) return std::nullopt;
  return path;
}

NodeCheck OtherIsScalar(double expected, double tolerance) {
  return [expected, tolerance](const Graph& graph, const Node& node, int followed) {
    return node.input_size() == 2 && IsScalarNear(graph, OtherInput(node, followed), expected, tolerance);
  };
}

Node* ProducerWithOp(const Graph& graph, const std::string& value, const char* op) {
  Node* node = graph.Producer(value);
  return node != nullptr && node->op_type() == op && node->domain().empty() ? node : nullptr;
}

Node* SoleConsumer(const Graph& graph, const std::string& value) {
  Node* reader = graph.SoleReader(value);
  return reader != nullptr && !graph.IsGraphOutput(value) ? reader : nullptr;
}

std::optional<int> FindOperand(const Node& node, const std::function<bool(const std::string& operand)>& wanted) {
  if (node.input_size() != 2) return std::nullopt;
  for (int index = 0; index < 2; ++index) {
    if (wanted(node.input(index))) return index;
  }
  return std::nullopt;
}

std::optional<std::string> OperandBesideScalar(const Graph& graph, const Node* node, const char* op, double expected,
                                               double tolerance) {
  if (node == nullptr || node->op_type() != op || !node->domain().empty()) return std::nullopt;
  const std::optional<int> scalar = FindOperand(
      *node, [&](const std::string& operand) { return IsScalarNear(graph, operand, expected, tolerance); });
  if (!scalar) return std::nullopt;
  return OtherInput(*node, *scalar);
}

std::optional<float> ConstantScalarFloat(const Graph& graph, const std::string& value) {
  auto floats = ConstantFloats(graph, value);
  if (!floats || floats->size() != 1) return std::nullopt;
  return (*floats)[0];
}

bool IsScalarNear(const Graph& graph, const std::string& value, double expected, double tolerance) {
  const std::optional<float> scalar = ConstantScalarFloat(graph, value);
  return scalar && std::fabs(*scalar - expected) <= tolerance;
}

bool IsMulOf(const Node* node, const std::string& a, const std::string& b) {
  return node != nullptr && node->op_type() == "Mul" && node->domain().empty() && node->input_size() == 2 &&
         ((node->input(0) == a && node->input(1) == b) || (node->input(0) == b && node->input(1) == a));
}

std::optional<std::pair<float, std::string>> ScalarScale(const Graph& graph, const Node* node) {
  if (node == nullptr || !node->domain().empty() || node->input_size() != 2) return std::nullopt;
  if (node->op_type() == "Div") {
    const std::optional<float> divisor = ConstantScalarFloat(graph, node->input(1));
    if (divisor && *divisor != 0) return std::make_pair(1.0f / *divisor, node->input(0));
  } else if (node->op_type() == "Mul") {
    const std::optional<int> factor = FindOperand(
        *node, [&](const std::string& operand) { return ConstantScalarFloat(graph, operand).has_value(); });
    if (factor) return std::make_pair(*ConstantScalarFloat(graph, node->input(*factor)), OtherInput(*node, *factor));
  }
  return std::nullopt;
}

std::vector<int64_t> PermOf(const Node* node) {
  const onnx::AttributeProto* perm = node == nullptr ? nullptr : node->FindAttribute("perm");
  return perm == nullptr ? std::vector<int64_t>() : std::vector<int64_t>(perm->ints().begin(), perm->ints().end());
}

bool SliceSpec::OneAxis(int64_t axis, int64_t rank) const {
  if (axes.size() != 1 || steps.size() != 1 || steps[0] != 1) return false;
  const int64_t sliced = axes[0] < 0 ? axes[0] + rank : axes[0];
  const int64_t wanted = axis < 0 ? axis + rank : axis;
  return sliced == wanted;
}

std::optional<SliceSpec> ParseSlice(const Graph& graph, const Node& slice) {
  if (slice.op_type() != "Slice" || !slice.domain().empty() || slice.input_size() < 3) return std::nullopt;
  auto optional_input = [&](int index) -> std::optional<std::vector<int64_t>> {
    if (slice.input_size() <= index || slice.input(index).empty()) return std::vector<int64_t>();
    return ConstantInts(graph, slice.input(index));
  };
  SliceSpec spec;
  spec.starts = ConstantInts(graph, slice.input(1));
  spec.ends = ConstantInts(graph, slice.input(2));
  std::optional<std::vector<int64_t>> axes = optional_input(3), steps = optional_input(4);
  if (!axes || !steps) return std::nullopt;
  spec.axes = *std::move(axes);
  spec.steps = *std::move(steps);
  size_t count = spec.axes.size();
  if (spec.axes.empty()) {
    if (!spec.starts) return std::nullopt;  // how many axes is unknown
    count = spec.starts->size();
    for (size_t i = 0; i < count; ++i) spec.axes.push_back(static_cast<int64_t>(i));
  }
  if (spec.steps.empty()) spec.steps.assign(count, 1);
  if (spec.steps.size() != count || (spec.starts && spec.starts->size() != count) ||
      (spec.ends && spec.ends->size() != count)) {
    return std::nullopt;
  }
  return spec;
}

std::optional<size_t> ShapeValueSize(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  if (std::optional<std::vector<int64_t>> ints = ConstantInts(graph, value)) return ints->size();
  const auto* symbolic = shapes.SymbolicValue(value);
  return symbolic != nullptr ? std::optional<size_t>(symbolic->size()) : std::nullopt;
}

std::optional<int64_t> ShapeValueElement(const Graph& graph, const ShapeInfo& shapes, const std::string& value,
                                         size_t index) {
  if (std::optional<std::vector<int64_t>> ints = ConstantInts(graph, value)) {
    return index < ints->size() ? std::optional<int64_t>((*ints)[index]) : std::nullopt;
  }
  const auto* symbolic = shapes.SymbolicValue(value);
  if (symbolic == nullptr || index >= symbolic->size() || !(*symbolic)[index].has_dim_value()) return std::nullopt;
  return (*symbolic)[index].dim_value();
}

std::optional<std::pair<std::string, int64_t>> ShapeDimRead(const Graph& graph, const ShapeInfo& shapes,
                                                            const Node& read) {
  const bool gather = read.op_type() == "Gather" && read.input_size() == 2 && read.GetAttributeInt("axis", 0) == 0;
  if (!read.domain().empty() || (!gather && read.op_type() != "Slice")) return std::nullopt;
  Node* shape = ProducerWithOp(graph, read.input(0), "Shape");
  const std::optional<int> rank = shape != nullptr ? shapes.Rank(shape->input(0)) : std::nullopt;
  if (!rank) return std::nullopt;
  // Shape(t, start, end) holds dims [start, end) of t.
  int64_t start = shape->GetAttributeInt("start", 0), end = shape->GetAttributeInt("end", *rank);
  if (start < 0) start += *rank;
  if (end < 0) end += *rank;
  end = std::min<int64_t>(end, *rank);
  const int64_t count = end - start;
  if (start < 0 || count <= 0) return std::nullopt;
  std::optional<int64_t> index;
  if (gather) {
    const std::optional<std::vector<int64_t>> indices = ConstantInts(graph, read.input(1));
    if (indices && indices->size() == 1) index = (*indices)[0] < 0 ? (*indices)[0] + count : (*indices)[0];
  } else if (const std::optional<SliceSpec> spec = ParseSlice(graph, read);
             spec && spec->starts && spec->ends && spec->OneAxis(0, 1)) {
    int64_t first = (*spec->starts)[0], last = (*spec->ends)[0];
    if (first < 0) first += count;
    if (last < 0) last += count;
    if (std::min<int64_t>(last, count) == first + 1) index = first;
  }
  if (!index || *index < 0 || *index >= count) return std::nullopt;
  return std::make_pair(shape->input(0), start + *index);
}

bool ElementIsDim(const Graph& graph, const ShapeInfo& shapes, const std::string& value, size_t index,
                  const std::string& shaped, int dim) {
  const onnx::TensorShapeProto::Dimension* want = shapes.Dim(shaped, dim);
  if (want == nullptr) return false;
  if (auto ints = ConstantInts(graph, value)) {
    return index < ints->size() && want->has_dim_value() && want->dim_value() == (*ints)[index];
  }
  const auto* symbolic = shapes.SymbolicValue(value);
  return symbolic != nullptr && index < symbolic->size() && SameDimension((*symbolic)[index], *want);
}

bool OnlyPatternReads(const Graph& graph, const std::vector<Node*>& pattern, const std::string& output) {
  for (const Node* node : pattern) {
    for (const std::string& value : node->proto().output()) {
      if (value.empty() || value == output) continue;
      if (graph.IsGraphOutput(value)) return false;
      for (Node* reader : graph.Consumers(value)) {
        if (std::find(pattern.begin(), pattern.end(), reader) == pattern.end()) return false;
      }
    }
  }
  return true;
}

}  // namespace onnxopt
