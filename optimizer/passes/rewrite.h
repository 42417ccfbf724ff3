// Small helpers shared by the fusion passes for building the nodes they emit.
#ifndef ONNXOPT_OPTIMIZER_PASSES_REWRITE_H_
#define ONNXOPT_OPTIMIZER_PASSES_REWRITE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"

namespace onnxopt {

inline onnx::AttributeProto IntAttribute(const std::string& name, int64_t value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INT);
  attribute.set_i(value);
  return attribute;
}

inline onnx::AttributeProto IntsAttribute(const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INTS);
  for (int64_t value : values) attribute.add_ints(value);
  return attribute;
}

inline onnx::AttributeProto FloatAttribute(const std::string& name, float value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::FLOAT);
  attribute.set_f(value);
  return attribute;
}

// A node of `op` (in `domain`, "" for ONNX's own) reading `inputs` and writing `outputs`.
inline onnx::NodeProto MakeNode(const std::string& op, const std::string& name, std::vector<std::string> inputs,
                                std::vector<std::string> outputs, const std::string& domain = "") {
  onnx::NodeProto node;
  node.set_op_type(op);
  node.set_name(name);
  if (!domain.empty()) node.set_domain(domain);
  for (auto& input : inputs) node.add_input(std::move(input));
  for (auto& output : outputs) node.add_output(std::move(output));
  return node;
}

// Adds Cast(value, to) before `anchor` and returns its output (ONNX Runtime's contrib operators take
// int32 ids and masks where exports have int64).
inline std::string AddCast(Graph& graph, const std::string& value, int32_t to, const Node* anchor) {
  onnx::NodeProto cast;
  cast.set_op_type("Cast");
  const std::string name = graph.UniqueName(value + (to == onnx::TensorProto::INT32 ? "_int32" : "_cast"));
  cast.set_name(name);
  cast.add_input(value);
  cast.add_output(name);
  *cast.add_attribute() = IntAttribute("to", to);
  graph.AddNode(std::move(cast), anchor, /*after=*/false);
  return name;
}

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_REWRITE_H_
