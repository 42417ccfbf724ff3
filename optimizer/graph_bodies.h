// The bodies (subgraphs) of an ONNX node, as protos: an If's branches, a Loop's or Scan's body.
#ifndef ONNXOPT_OPTIMIZER_GRAPH_BODIES_H_
#define ONNXOPT_OPTIMIZER_GRAPH_BODIES_H_

#include "onnx/onnx_pb.h"

namespace onnxopt {

// Calls fn(const onnx::GraphProto&) on each graph-valued attribute of `node`, in attribute order.
template <typename Fn>
void ForEachBody(const onnx::NodeProto& node, Fn fn) {
  for (const auto& attribute : node.attribute()) {
    if (attribute.has_g()) fn(attribute.g());
    for (const auto& body : attribute.graphs()) fn(body);
  }
}

// The same with fn(onnx::GraphProto*), to edit them.
template <typename Fn>
void ForEachMutableBody(onnx::NodeProto* node, Fn fn) {
  for (auto& attribute : *node->mutable_attribute()) {
    if (attribute.has_g()) fn(attribute.mutable_g());
    for (auto& body : *attribute.mutable_graphs()) fn(&body);
  }
}

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_GRAPH_BODIES_H_
