// Small pattern-matching helpers shared by the fusion passes.
#ifndef ONNXOPT_OPTIMIZER_PASSES_MATCH_H_
#define ONNXOPT_OPTIMIZER_PASSES_MATCH_H_

#include <optional>
#include <string>

#include "optimizer/graph.h"
#include "optimizer/passes/constants.h"
#include "optimizer/shape_info.h"

namespace onnxopt {

// The node producing `value` if it is `op` in the default domain.
inline Node* ProducerWithOp(const Graph& graph, const std::string& value, const char* op) {
  Node* node = graph.Producer(value);
  return node != nullptr && node->op_type() == op && node->domain().empty() ? node : nullptr;
}

// The one node reading `value`, if exactly one does and it is no graph output.
inline Node* SoleConsumer(const Graph& graph, const std::string& value) {
  Node* reader = graph.SoleReader(value);
  return reader != nullptr && !graph.IsGraphOutput(value) ? reader : nullptr;
}

// A constant float holding one element (a scalar or a 1-element tensor).
inline std::optional<float> ConstantScalarFloat(const Graph& graph, const std::string& value) {
  auto floats = ConstantFloats(graph, value);
  if (!floats || floats->size() != 1) return std::nullopt;
  return (*floats)[0];
}

// True if element `index` of the small integer tensor `value` (a constant, or shape arithmetic the
// shapes pin down) is the same number or named dim as dim `dim` of `shaped` (negative: from the end).
inline bool ElementIsDim(const Graph& graph, const ShapeInfo& shapes, const std::string& value, size_t index,
                         const std::string& shaped, int dim) {
  const onnx::TensorShapeProto::Dimension* want = shapes.Dim(shaped, dim);
  if (want == nullptr) return false;
  if (auto ints = ConstantInts(graph, value)) {
    return index < ints->size() && want->has_dim_value() && want->dim_value() == (*ints)[index];
  }
  const auto* symbolic = shapes.SymbolicValue(value);
  return symbolic != nullptr && index < symbolic->size() && SameDimension((*symbolic)[index], *want);
}

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_MATCH_H_
