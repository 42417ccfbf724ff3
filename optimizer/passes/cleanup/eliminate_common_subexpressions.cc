// eliminate_common_subexpressions: merges nodes that compute the same thing from the same inputs.
//
// Before:  X -> Shape -> a ; X -> Shape -> b ; f(a, b)         After:  X -> Shape -> a ; f(a, a)
// Two nodes are the same when op type, domain, inputs (in order) and attributes are equal. Random
// operators, nodes with subgraphs and nodes outside the ONNX domains are never merged; a duplicate whose
// output is a graph output keeps its node.
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

bool Mergeable(const Node& node) {
  static const std::unordered_set<std::string> kRandom = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                                          "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"};
  // com.microsoft has random operators of its own (BiasDropout, BitmaskDropout...): left out.
  const bool known_domain = node.domain().empty() || node.domain() == "ai.onnx.ml";
  return known_domain && node.subgraphs().empty() && node.implicit_inputs().empty() && kRandom.count(node.op_type()) == 0;
}

std::string Key(const Node& node) {
  std::string key = absl::StrCat(node.domain(), "::", node.op_type(), "(", absl::StrJoin(node.proto().input(), ","), ")#",
                                 node.output_size(), "|");
  // Attributes as serialized bytes, sorted by name so their order does not matter.
  std::vector<std::pair<std::string, std::string>> attributes;
  for (const auto& attribute : node.proto().attribute()) {
    attributes.emplace_back(attribute.name(), attribute.SerializeAsString());
  }
  std::sort(attributes.begin(), attributes.end());
  for (const auto& attribute : attributes) absl::StrAppend(&key, attribute.first, "=", attribute.second, ";");
  return key;
}

class EliminateCommonSubexpressionsPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_common_subexpressions"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override { return "Merge nodes with the same op, inputs and attributes"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    std::unordered_map<std::string, Node*> seen;
    for (Node* node : graph.Nodes()) {  // topological: inputs are already merged when a node is keyed
      if (!Mergeable(*node)) continue;
      auto [it, inserted] = seen.emplace(Key(*node), node);
      if (inserted) continue;
      Node* original = it->second;
      bool feeds_output = false;
      for (int i = 0; i < node->output_size(); ++i) feeds_output |= graph.IsGraphOutput(node->output(i));
      if (feeds_output) {
        context.Skip("duplicate computes a graph output");
        continue;
      }
      std::vector<std::pair<std::string, std::string>> renames;
      bool optional_mismatch = false;
      for (int i = 0; i < node->output_size(); ++i) {
        if (node->output(i).empty()) continue;
        if (original->output(i).empty()) optional_mismatch = true;
        renames.emplace_back(node->output(i), original->output(i));
      }
      if (optional_mismatch) {
        context.Skip("duplicate uses an optional output the first one omits");
        continue;
      }
      graph.RemoveNode(node);
      for (const auto& [from, to] : renames) graph.ReplaceAllUsesWith(from, to);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateCommonSubexpressionsPass() {
  return std::make_unique<EliminateCommonSubexpressionsPass>();
}

}  // namespace onnxopt
