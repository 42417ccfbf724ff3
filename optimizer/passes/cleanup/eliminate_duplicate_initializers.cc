// eliminate_duplicate_initializers: makes identical initializers (same type, dims and bytes) one.
//
// Before:  W1 = [1 2 3], W2 = [1 2 3]; A(x, W1), B(y, W2)      After:  W1 = [1 2 3]; A(x, W1), B(y, W1)
// Initializers that are graph inputs (overridable) or graph outputs keep their identity.
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/passes.h"
#include "optimizer/sha256.h"

namespace onnxopt {
namespace {

class EliminateDuplicateInitializersPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_duplicate_initializers"; }
  absl::string_view description() const override { return "Merge initializers with the same type, shape and contents"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    std::unordered_map<std::string, std::string> first_by_content;
    std::vector<std::pair<std::string, std::string>> merges;
    for (const auto& tensor : graph.proto().initializer()) {
      const std::string& name = tensor.name();
      if (graph.Initializer(name) == nullptr || graph.IsGraphInput(name) || graph.IsGraphOutput(name)) continue;
      if (tensor.data_location() == onnx::TensorProto::EXTERNAL) continue;
      onnx::TensorProto content = tensor;  // everything but the name and doc string
      content.clear_name();
      content.clear_doc_string();
      // Keyed by digest so the map never holds a second copy of the weights.
      auto [it, inserted] = first_by_content.emplace(Sha256OfBytes(content.SerializeAsString()), name);
      if (!inserted) merges.emplace_back(name, it->second);
    }
    for (const auto& [duplicate, original] : merges) {
      graph.ReplaceAllUsesWith(duplicate, original);
      graph.RemoveInitializer(duplicate);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeEliminateDuplicateInitializersPass() {
  return std::make_unique<EliminateDuplicateInitializersPass>();
}

}  // namespace onnxopt
