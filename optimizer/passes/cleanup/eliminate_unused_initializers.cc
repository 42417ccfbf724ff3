// eliminate_unused_initializers: drops initializers nothing reads.
//
// Before:  initializer W (no consumers)       After:  (W gone, and its bytes with it)
// An initializer that is also listed as a graph input (IR < 4 style) is part of the model's
// interface and is kept.
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class EliminateUnusedInitializersPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_unused_initializers"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override { return "Remove initializers that no node or output reads"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    std::vector<std::string> unused;
    for (const auto& initializer : graph.proto().initializer()) {
      const std::string& name = initializer.name();
      if (graph.Initializer(name) == nullptr) continue;  // already removed
      if (graph.HasConsumers(name) || graph.IsGraphOutput(name)) continue;
      if (graph.IsGraphInput(name)) {
        context.Skip("unused initializer is also a graph input");
        continue;
      }
      unused.push_back(name);
    }
    for (const std::string& name : unused) {
      graph.RemoveInitializer(name);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateUnusedInitializersPass() {
  return std::make_unique<EliminateUnusedInitializersPass>();
}

}  // namespace onnxopt
