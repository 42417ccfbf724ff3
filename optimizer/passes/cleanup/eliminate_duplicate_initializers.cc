// eliminate_duplicate_initializers: makes identical initializers (same type, dims and bytes) one.
//
// Before:  W1 = [1 2 3], W2 = [1 2 3]; A(x, W1), B(y, W2)      After:  W1 = [1 2 3]; A(x, W1), B(y, W1)
// Initializers that are graph inputs (overridable) or graph outputs keep their identity.
//
// Every layer of a transformer has weights of one shape, so shape alone groups nearly everything.
// Within a group a tensor is fingerprinted by three 4 KiB windows (start, middle, end) and only
// tensors whose fingerprints agree are compared in full, so a pass over a 1 GB model reads a few
// MB, whether the weights are in memory or by reference in their file.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

constexpr int64_t kWindowBytes = 4096;

bool HasRawBytes(const onnx::TensorProto& tensor) { return tensor.has_raw_data() || IsByReference(tensor); }

// Type, dims and data size; tensors with typed fields (small, by nature) are keyed by all their
// content instead.
std::string GroupKey(const onnx::TensorProto& tensor) {
  if (!HasRawBytes(tensor)) {
    onnx::TensorProto content = tensor;
    content.clear_name();
    content.clear_doc_string();
    return absl::StrCat("typed:", content.SerializeAsString());
  }
  return absl::StrCat("raw:", tensor.data_type(), ":", absl::StrJoin(tensor.dims(), ","), ":", TensorDataBytes(tensor));
}

std::optional<size_t> Fingerprint(const onnx::TensorProto& tensor) {
  const int64_t size = TensorDataBytes(tensor);
  std::vector<std::pair<int64_t, int64_t>> windows;
  if (size <= 3 * kWindowBytes) {
    windows = {{0, size}};
  } else {
    windows = {{0, kWindowBytes}, {size / 2 - kWindowBytes / 2, kWindowBytes}, {size - kWindowBytes, kWindowBytes}};
  }
  size_t hash = 0;
  std::string bytes;
  for (const auto& [offset, length] : windows) {
    if (!ReadTensorBytes(tensor, offset, length, &bytes).ok()) return std::nullopt;
    hash = absl::HashOf(hash, bytes);
  }
  return hash;
}

class EliminateDuplicateInitializersPass final : public Pass {
 public:
  absl::string_view name() const override { return "eliminate_duplicate_initializers"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override { return "Merge initializers with the same type, shape and contents"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    std::map<std::string, std::vector<const onnx::TensorProto*>> groups;
    for (const auto& tensor : graph.proto().initializer()) {
      const std::string& name = tensor.name();
      if (graph.Initializer(name) == nullptr || graph.IsGraphInput(name) || graph.IsGraphOutput(name)) continue;
      if (tensor.data_location() == onnx::TensorProto::EXTERNAL && !IsByReference(tensor)) continue;
      groups[GroupKey(tensor)].push_back(&tensor);
    }
    std::vector<std::pair<std::string, std::string>> merges;
    for (const auto& [key, members] : groups) {
      if (members.size() < 2) continue;
      const bool typed = !HasRawBytes(*members.front());
      // Tensors kept so far, by fingerprint; a newcomer merges into the first kept one it equals.
      std::unordered_map<size_t, std::vector<const onnx::TensorProto*>> kept;
      for (const onnx::TensorProto* tensor : members) {
        std::optional<size_t> fingerprint = typed ? std::optional<size_t>(0) : Fingerprint(*tensor);
        if (!fingerprint) continue;
        std::vector<const onnx::TensorProto*>& same_print = kept[*fingerprint];
        const onnx::TensorProto* equal = nullptr;
        for (const onnx::TensorProto* candidate : same_print) {
          if (typed || SameTensorBytes(*candidate, *tensor)) {
            equal = candidate;
            break;
          }
        }
        if (equal != nullptr) {
          merges.emplace_back(tensor->name(), equal->name());
        } else {
          same_print.push_back(tensor);
        }
      }
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
