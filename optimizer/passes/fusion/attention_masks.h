// What a boolean attention mask means, whatever way the exporter spelled it.
//
// Hugging Face transformers 5 builds masks in `masking_utils` from index arithmetic: Range over the
// batch, query and key positions, GreaterOrEqual/LessOrEqual/And, a Gather into the flattened
// [B, T] attention_mask, Expand or Reshape plumbing, and the exporters write each of these in their own
// way (and will again). Matching those spellings node by node is what breaks ONNX Runtime's own
// fusions. Instead, the mask's subgraph is run in ONNX Runtime on probe inputs, and its values tell
// what it is:
//   kAllTrue      every position attends everywhere (an encoder without padding, ViT);
//   kAllFalse     no position attends anywhere (a test graph's constant condition): where the original
//                 zeroes the probabilities of masked rows, the block's output is 0;
//   kKeyPadding   mask[b, h, q, t] == (attention_mask[b, t] != 0) for one graph input [B, T] (or
//                 [B, 1, T], WeNet's and ESPnet's, or [B, 1, 1, T], squeezed by the fusion), the raw
//                 mask ONNX Runtime's Attention takes as mask_index; or (== 0) of it, a mask true on
//                 padding (NeMo's pad_mask), negated by the fusion;
//   kCausal       mask[b, h, q, t] == (t <= q + P), the queries the last S = T - P of the keys' tokens
//                 (P = 0 without a cache; a decoder without padding): Attention's unidirectional;
//   kCausalKeyPadding  both at once (a decoder with a padded batch);
//   kSlidingWindow     mask[b, h, q, t] == (t <= q + P && q + P - t < W): causal within the last W keys
//                      (Mistral, Phi-3, Gemma's local layers), GroupQueryAttention's local_window_size;
//   kSlidingWindowKeyPadding  that and key padding.
// The probe covers batch sizes 1-3 and lengths 1-40 (with a key/value cache (cache_interface.h) also
// a decode step and a chunk after a past, its dims bound by role), and one length past the largest integer constant
// the mask's nodes read (so a sliding window of W is probed at W + 2, and its W is one of those
// constants or one more; past a window of 4096 the mask is unknown),
// with every input filled with small random numbers 0-3 (a mask must read != 0, as Attention's raw
// mask does, not == 1; a padding id other than 0 shows). Left padding leaves whole rows of a causal +
// padding mask masked, where the original's NaN guard gives 0 and the fused operator the mean of V:
// the fusion zeroes those rows from the mask itself (MaskPlan::zero_masked_rows).
#ifndef ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MASKS_H_
#define ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MASKS_H_

#include <cstdint>
#include <map>
#include <string>

#include "optimizer/graph.h"
#include "optimizer/pass.h"

namespace onnxopt {

struct MaskMeaning {
  enum class Kind {
    kUnknown,
    kAllTrue,
    kAllFalse,
    kKeyPadding,
    kCausal,
    kCausalKeyPadding,
    kSlidingWindow,
    kSlidingWindowKeyPadding
  } kind = Kind::kUnknown;
  std::string padding_input;  // k*KeyPadding: the graph input holding the [B, T] mask
  bool padding_inverted = false;  // kKeyPadding: that input is non-zero on padding (masked == input != 0)
  int64_t window = 0;         // kSlidingWindow*: W, the keys a query sees counting itself
  std::string why;            // kUnknown: what the probe found
  // The mask was [B or 1, 1, L, L] on every probe of length L: fit as an attention bias as it is.
  bool bias_shaped = false;
  // No probe let a query see a later key (t > q): whatever else it masks (a sliding window, padding),
  // a causal kernel given this mask as a bias computes the same.
  bool within_causal = false;
};

// The meaning of the boolean value `mask` (rank 4, [B or 1, H or 1, S, T]) of the main graph; with
// `additive`, of the float `mask` added to the scores, read as kept where it is 0 (every value must be 0
// or at most -1e4, else the meaning is unknown; its inputs are probed with 0/1 only, as (1 - m) * min
// expects).
MaskMeaning ProbeMaskMeaning(const Graph& graph, const PassContext& context, const std::string& mask,
                             bool additive = false);

// Meanings probed once per pass run: the layers of a model share their mask.
class MaskProbes {
 public:
  const MaskMeaning& Probe(const Graph& graph, const PassContext& context, const std::string& mask,
                           bool additive = false);
  // How many masks were probed in ONNX Runtime.
  int64_t count() const { return static_cast<int64_t>(probed_.size()); }

 private:
  std::map<std::pair<std::string, bool>, MaskMeaning> probed_;  // (mask, additive)
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MASKS_H_
