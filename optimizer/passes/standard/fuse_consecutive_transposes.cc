// fuse_consecutive_transposes: two Transposes in a row become one (or none).
//
// Before:  X -> Transpose(p1) -> t -> Transpose(p2) -> Y      After:  X -> Transpose(p) -> Y,
//          p[i] = p1[p2[i]]; no node at all when p is the identity.
// The first Transpose stays if something else reads t. Both need explicit perms.
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

std::vector<int64_t> Perm(const Node& node) {
  const onnx::AttributeProto* attribute = node.FindAttribute("perm");
  if (attribute == nullptr) return {};
  return {attribute->ints().begin(), attribute->ints().end()};
}

class FuseConsecutiveTransposesPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_consecutive_transposes"; }
  absl::string_view description() const override { return "Merge a Transpose of a Transpose into one permutation"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* second : graph.Nodes()) {
      if (second->removed() || second->op_type() != "Transpose" || !second->domain().empty()) continue;
      Node* first = graph.Producer(second->input(0));
      if (first == nullptr || first->op_type() != "Transpose" || !first->domain().empty()) continue;
      const std::vector<int64_t> p1 = Perm(*first);
      const std::vector<int64_t> p2 = Perm(*second);
      if (p1.empty() || p2.empty() || p1.size() != p2.size()) {
        context.Skip("a Transpose has no explicit perm");
        continue;
      }
      std::vector<int64_t> composed(p1.size());
      bool identity = true;
      for (size_t i = 0; i < p2.size(); ++i) {
        if (p2[i] < 0 || p2[i] >= static_cast<int64_t>(p1.size())) return absl::OkStatus();  // invalid model
        composed[i] = p1[static_cast<size_t>(p2[i])];
        identity &= composed[i] == static_cast<int64_t>(i);
      }
      const std::string source = first->input(0);
      const std::string middle = first->output(0);
      if (identity) {
        if (!BypassNode(graph, second, source, second->output(0), context)) continue;
      } else {
        onnx::NodeProto merged = second->proto();
        merged.set_input(0, source);
        for (auto& attribute : *merged.mutable_attribute()) {
          if (attribute.name() != "perm") continue;
          attribute.clear_ints();
          for (int64_t axis : composed) attribute.add_ints(axis);
        }
        graph.RemoveNode(second);
        graph.AddNode(std::move(merged), first, /*after=*/true);
        context.CountRewrite();
      }
      if (!graph.HasConsumers(middle) && !graph.IsGraphOutput(middle)) graph.RemoveNode(first);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseConsecutiveTransposesPass() { return std::make_unique<FuseConsecutiveTransposesPass>(); }

}  // namespace onnxopt
