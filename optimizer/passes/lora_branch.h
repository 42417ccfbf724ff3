// peft's unmerged LoRA branch, as both exporters write it and as extract_adapters leaves it: what the
// extraction and the attention fusion (a LoRA projection is still a projection) both match.
#ifndef ONNXOPT_OPTIMIZER_PASSES_LORA_BRANCH_H_
#define ONNXOPT_OPTIMIZER_PASSES_LORA_BRANCH_H_

#include <optional>
#include <string>

#include "onnx/onnx_pb.h"
#include "optimizer/graph.h"

namespace onnxopt {

struct LoraBranch {
  Node* scale = nullptr;     // Mul or Div by a scalar; null when the scale is 1
  float scale_value = 1.0f;  // the multiplier (a Div's inverted)
  Node* down = nullptr;      // MatMul(x, A)
  Node* up = nullptr;        // MatMul(h, B)
  std::string x;
  // A [in, r] and B [r, out] when they are constants; null when they are adapter inputs.
  const onnx::TensorProto* a = nullptr;
  const onnx::TensorProto* b = nullptr;
};

// `value` as [Mul(] MatMul(MatMul(x, A), B) [, s)] (the scale on either side, or a Div, or none), A and
// B constant matrices of one rank or adapter inputs (lora_adapter.h).
std::optional<LoraBranch> MatchLoraBranch(const Graph& graph, const std::string& value);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_LORA_BRANCH_H_
