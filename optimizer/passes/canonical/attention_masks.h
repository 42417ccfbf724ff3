// What a boolean attention mask means, whatever way the exporter spelled it.
//
// Hugging Face transformers 5 builds masks in `masking_utils` from index arithmetic: Range over the
// batch, query and key positions, GreaterOrEqual/LessOrEqual/And, a Gather into the flattened
// [B, T] attention_mask, Expand or Reshape plumbing, and the exporters write each of these in their own
// way (and will again). Matching those spellings node by node is what breaks ONNX Runtime's own
// fusions. Instead, the mask's subgraph is run in ONNX Runtime on probe inputs, and its values tell
// what it is:
//   kAllTrue      every position attends everywhere (an encoder without padding, ViT);
//   kKeyPadding   mask[b, h, q, t] == (attention_mask[b, t] != 0) for one rank-2 graph input, the raw
//                 mask ONNX Runtime's Attention takes as mask_index;
//   kCausal       mask[b, h, q, t] == (t <= q), queries and keys the same tokens (a decoder without
//                 padding): Attention's unidirectional;
//   kCausalKeyPadding  both at once (a decoder with a padded batch).
// The probe covers batch sizes 1-3 and lengths 1-40 with random 0/1 masks (rows fully masked among
// them); a mask that only differs from these meanings at other lengths (a sliding window wider than
// 40) would be misread, which is why the fusions also require the key and query positions to come
// from the same tokens and the job's parity check runs on the user's shapes afterwards.
#ifndef ONNXOPT_OPTIMIZER_PASSES_CANONICAL_ATTENTION_MASKS_H_
#define ONNXOPT_OPTIMIZER_PASSES_CANONICAL_ATTENTION_MASKS_H_

#include <string>

#include "optimizer/graph.h"
#include "optimizer/pass.h"

namespace onnxopt {

struct MaskMeaning {
  enum class Kind { kUnknown, kAllTrue, kKeyPadding, kCausal, kCausalKeyPadding } kind = Kind::kUnknown;
  std::string padding_input;  // k*KeyPadding: the graph input holding the [B, T] mask
  std::string why;            // kUnknown: what the probe found
};

// The meaning of the boolean value `mask` (rank 4, [B or 1, H or 1, S, T]) of the main graph.
MaskMeaning ProbeMaskMeaning(const Graph& graph, const PassContext& context, const std::string& mask);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_CANONICAL_ATTENTION_MASKS_H_
