#include "optimizer/passes/lora_branch.h"

#include "optimizer/lora_adapter.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"

namespace onnxopt {

std::optional<LoraBranch> MatchLoraBranch(const Graph& graph, const std::string& value) {
  LoraBranch branch;
  std::string product = value;
  if (auto scaled = ScalarScale(graph, graph.Producer(value))) {
    branch.scale = graph.Producer(value);
    branch.scale_value = scaled->first;
    product = scaled->second;
  }
  std::optional<PathMatch> path = MatchPath(graph, product, {{"MatMul"}, {"MatMul"}});
  if (!path) return std::nullopt;
  branch.up = path->nodes[0];
  branch.down = path->nodes[1];
  branch.x = path->end;
  auto adapter_input = [&](const std::string& name) {
    return graph.IsGraphInput(name) && ParseAdapterParameterName(name);
  };
  const std::string& a = branch.down->input(1);
  const std::string& b = branch.up->input(1);
  if (adapter_input(a) && adapter_input(b)) return branch;
  branch.a = ConstantTensor(graph, a);
  branch.b = ConstantTensor(graph, b);
  if (branch.a == nullptr || branch.b == nullptr || branch.a->dims_size() != 2 || branch.b->dims_size() != 2 ||
      branch.a->dims(1) != branch.b->dims(0)) {
    return std::nullopt;
  }
  return branch;
}

}  // namespace onnxopt
