#include "optimizer/passes/bypass.h"

namespace onnxopt {

bool BypassNode(Graph& graph, Node* node, const std::string& input, const std::string& output,
                PassContext& context) {
  if (!graph.IsGraphOutput(output)) {
    graph.RemoveNode(node);
    graph.ReplaceAllUsesWith(output, input);
    context.CountRewrite();
    return true;
  }
  // The graph output's name is part of the model's interface: keep it, give it to the input value.
  Node* producer = graph.Producer(input);
  if (producer == nullptr || graph.IsGraphOutput(input)) {
    context.Skip("output is a graph output fed directly by a graph input, initializer, outer value or another output");
    return false;
  }
  graph.RemoveNode(node);
  if (!graph.RenameValue(input, output).ok()) {
    context.Skip("could not rename the input value to the graph output's name");
    return false;  // unreachable in a valid graph: the preconditions above are RenameValue's
  }
  context.CountRewrite();
  return true;
}

}  // namespace onnxopt
