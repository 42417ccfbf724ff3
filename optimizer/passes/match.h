// Small pattern-matching helpers shared by the fusion passes.
#ifndef ONNXOPT_OPTIMIZER_PASSES_MATCH_H_
#define ONNXOPT_OPTIMIZER_PASSES_MATCH_H_

#include <optional>
#include <string>

#include "optimizer/graph.h"
#include "optimizer/passes/constants.h"

namespace onnxopt {

// The node producing `value` if it is `op` in the default domain.
inline Node* ProducerWithOp(const Graph& graph, const std::string& value, const char* op) {
  Node* node = graph.Producer(value);
  return node != nullptr && node->op_type() == op && node->domain().empty() ? node : nullptr;
}

// The one node reading `value`, if exactly one does and it is no graph output.
inline Node* SoleConsumer(const Graph& graph, const std::string& value) {
  auto consumers = graph.Consumers(value);
  return consumers.size() == 1 && !graph.IsGraphOutput(value) ? consumers[0] : nullptr;
}

// A constant float holding one element (a scalar or a 1-element tensor).
inline std::optional<float> ConstantScalarFloat(const Graph& graph, const std::string& value) {
  auto floats = ConstantFloats(graph, value);
  if (!floats || floats->size() != 1) return std::nullopt;
  return (*floats)[0];
}

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_MATCH_H_
