// eliminate_common_subexpressions: merges nodes that compute the same thing from the same inputs.
//
// Before:  X -> Shape -> a ; X -> Shape -> b ; f(a, b)         After:  X -> Shape -> a ; f(a, a)
// Two nodes are the same when op type, domain, inputs (in order) and attributes are equal. Random
// operators, nodes with subgraphs and nodes outside the ONNX domains are never merged; a duplicate whose
// output is a graph output keeps its node.
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

bool Mergeable(const Node& node) {
  static const auto* kRandom = new absl::flat_hash_set<absl::string_view>{
      "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"};
  // com.microsoft has random operators of its own (BiasDropout, BitmaskDropout...): left out.
  const bool known_domain = node.domain().empty() || node.domain() == "ai.onnx.ml";
  return known_domain && node.subgraphs().empty() && node.implicit_inputs().empty() &&
         !kRandom->contains(node.op_type());
}

// Attributes as (name, serialized bytes), sorted by name so that their order does not matter.
std::vector<std::pair<std::string, std::string>> SortedAttributes(const Node& node) {
  std::vector<std::pair<std::string, std::string>> attributes;
  attributes.reserve(static_cast<size_t>(node.proto().attribute_size()));
  for (const auto& attribute : node.proto().attribute()) {
    attributes.emplace_back(attribute.name(), attribute.SerializeAsString());
  }
  std::sort(attributes.begin(), attributes.end());
  return attributes;
}

// Hashes what Same compares, without building a key per node: attributes are hashed from their
// bytes in a reused buffer and combined by a sum, which their order does not change (sorting them
// per node cost a vector and a string per attribute, a third of an idle run at 100k nodes).
size_t Fingerprint(const Node& node, std::string* buffer) {
  size_t hash = absl::HashOf(node.domain(), node.op_type(), node.output_size());
  for (const auto& input : node.proto().input()) hash = absl::HashOf(hash, input);
  size_t attributes = 0;
  for (const auto& attribute : node.proto().attribute()) {
    attribute.SerializeToString(buffer);
    attributes += absl::HashOf(attribute.name(), *buffer);
  }
  return absl::HashOf(hash, attributes);
}

// Same op, domain, inputs in order, number of outputs and attributes.
bool Same(const Node& node, const Node& seen) {
  const onnx::NodeProto& a = node.proto();
  const onnx::NodeProto& b = seen.proto();
  if (a.op_type() != b.op_type() || node.domain() != seen.domain() || a.output_size() != b.output_size() ||
      a.input_size() != b.input_size() || a.attribute_size() != b.attribute_size() ||
      !std::equal(a.input().begin(), a.input().end(), b.input().begin())) {
    return false;
  }
  return SortedAttributes(node) == SortedAttributes(seen);  // fingerprints matched: almost always a twin
}

class EliminateCommonSubexpressionsPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_common_subexpressions"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override { return "Merge nodes with the same op, inputs and attributes"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    // By fingerprint, first seen first. Only nodes are kept: attributes are compared when a
    // fingerprint matches, which is rare but for twins.
    absl::flat_hash_map<size_t, absl::InlinedVector<Node*, 1>> seen;
    std::string buffer;
    for (Node* node : graph.Nodes()) {  // topological: inputs are already merged when a node is compared
      if (!Mergeable(*node)) continue;
      absl::InlinedVector<Node*, 1>& candidates = seen[Fingerprint(*node, &buffer)];
      auto twin = std::find_if(candidates.begin(), candidates.end(),
                               [&](const Node* candidate) { return Same(*node, *candidate); });
      if (twin == candidates.end()) {
        candidates.push_back(node);
        continue;
      }
      Node* original = *twin;
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
