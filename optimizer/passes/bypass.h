// Removing a node whose output equals one of its inputs (Identity, inference Dropout, no-op Cast...).
#ifndef ONNXOPT_OPTIMIZER_PASSES_BYPASS_H_
#define ONNXOPT_OPTIMIZER_PASSES_BYPASS_H_

#include <string>

#include "optimizer/graph.h"
#include "optimizer/pass.h"

namespace onnxopt {

// Removes `node` and makes readers of `output` read `input` instead. When `output` is a graph output
// the value `input` is renamed to `output` instead, which needs `input` to be a node output of this
// graph that is not itself a graph output. Returns true if it rewrote; otherwise records the skip
// reason in `context` and leaves the graph as it was.
bool BypassNode(Graph& graph, Node* node, const std::string& input, const std::string& output,
                PassContext& context);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_BYPASS_H_
