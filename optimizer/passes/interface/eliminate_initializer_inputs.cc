// eliminate_initializer_inputs: stops listing initializers as graph inputs (an IR < 4 habit).
//
// Before:  inputs: [x, W], initializers: [W]        After:  inputs: [x], initializers: [W]
// Such inputs may be overridden at run time, so nothing can treat W as a constant; after this pass
// folding and fusions can. It changes the model's interface (W can no longer be fed), so it is in the
// extended preset, not the basic one. Needs IR version >= 4, where initializers need not be inputs.
#include "optimizer/cache_interface.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class EliminateInitializerInputsPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_initializer_inputs"; }
  absl::string_view description() const override {
    return "Remove graph inputs that have an initializer, so they become constants (changes the interface)";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    if (context.model().ir_version() < 4) {
      context.Skip("IR version < 4 requires initializers to be graph inputs");
      return absl::OkStatus();
    }
    std::vector<std::string> names;
    for (const auto& input : graph.proto().input()) {
      if (graph.Initializer(input.name()) == nullptr) continue;
      if (ParseAdapterParameterName(input.name())) {
        context.Skip("a LoRA adapter input (extract_adapters): adapters feed it at run time");
        continue;
      }
      if (input.name() == kLogitsToKeepInput) {
        context.Skip("logits_to_keep (the logits_to_keep pass): callers feed it at run time");
        continue;
      }
      names.push_back(input.name());
    }
    for (const std::string& name : names) {
      graph.RemoveGraphInput(name);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateInitializerInputsPass() { return std::make_unique<EliminateInitializerInputsPass>(); }

}  // namespace onnxopt
