// Running part of a graph on its own in ONNX Runtime: what passes that probe a subgraph's meaning
// (attention masks, relative-position functions) evaluate it with.
#ifndef ONNXOPT_OPTIMIZER_PASSES_SUBGRAPH_SESSION_H_
#define ONNXOPT_OPTIMIZER_PASSES_SUBGRAPH_SESSION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass.h"

namespace onnxopt {

// A session over `nodes` of `graph` (in graph order) and the initializers they read, fed by `inputs`,
// answering `outputs`; the model's opsets, no graph optimizations, one thread.
absl::StatusOr<std::unique_ptr<Ort::Session>> SubgraphSession(const Graph& graph, const PassContext& context,
                                                              const std::vector<const Node*>& nodes,
                                                              const std::vector<onnx::ValueInfoProto>& inputs,
                                                              const std::vector<std::string>& outputs,
                                                              const std::string& name);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_SUBGRAPH_SESSION_H_
