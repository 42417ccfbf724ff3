#include "optimizer/passes/subgraph_session.h"

#include <algorithm>
#include <unordered_set>

#include "optimizer/model_io.h"

namespace onnxopt {

absl::StatusOr<std::unique_ptr<Ort::Session>> SubgraphSession(const Graph& graph, const PassContext& context,
                                                              const std::vector<const Node*>& nodes,
                                                              const std::vector<onnx::ValueInfoProto>& inputs,
                                                              const std::vector<std::string>& outputs,
                                                              const std::string& name) {
  onnx::ModelProto model;
  model.set_ir_version(std::max<int64_t>(context.model().ir_version(), 7));
  *model.mutable_opset_import() = context.model().opset_import();
  onnx::GraphProto* subgraph = model.mutable_graph();
  subgraph->set_name(name);
  for (const onnx::ValueInfoProto& input : inputs) *subgraph->add_input() = input;
  std::unordered_set<std::string> added;
  for (const Node* node : nodes) {
    *subgraph->add_node() = node->proto();
    for (const std::string& input : node->proto().input()) {
      const onnx::TensorProto* initializer = graph.Initializer(input);
      if (initializer != nullptr && added.insert(input).second) *subgraph->add_initializer() = *initializer;
    }
  }
  for (const std::string& output : outputs) subgraph->add_output()->set_name(output);
  SessionSettings settings;
  settings.optimization_level = ORT_DISABLE_ALL;
  settings.intra_op_threads = 1;
  absl::StatusOr<std::string> bytes = SerializeForRuntime(model);
  if (!bytes.ok()) return bytes.status();
  return CreateSession({*std::move(bytes), {}}, settings);
}

}  // namespace onnxopt
