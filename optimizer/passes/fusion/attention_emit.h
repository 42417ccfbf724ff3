// The operators a matched attention block (attention_match.h) becomes. Each emitter first plans (its
// own checks, cheap ones before the mask is probed, and the pattern it replaces), then emits.
//
// Attention (emit_attention.cc): the projections go inside, packed [Wq|Wk|Wv]; for blocks whose Q, K
// and V project one input with no rotation between projection and scores (BERT, GPT-2, ViT, T5).
// MultiHeadAttention (emit_multi_head_attention.cc): the projections stay outside; for rotated Q and K
// (rotary embeddings sit between the projections and the scores) and grouped-query K and V.
// GroupQueryAttention (emit_group_query_attention.cc): the same block with K and V left at their own
// heads, which the kernel shares among the query heads; for masks within the causal one (padding and
// windows as attention_bias), chosen by fuse_attention's grouped_query parameter.
#ifndef ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_EMIT_H_
#define ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_EMIT_H_

#include <string>
#include <vector>

#include "optimizer/passes/fusion/attention_match.h"

namespace onnxopt::attention {

// What the emitters share: the pattern to replace and the shape arithmetic that goes with it.
struct Replacement {
  std::vector<Node*> pattern;
  std::vector<Node*> shape_nodes;
};

// Attention: the checks of its packed projection and what it replaces.
struct AttentionPlan : Replacement {
  std::string input;              // [B,S,H_in]: x, or what the sequence-first x transposes
  int64_t input_hidden = 0;
  bool packed = false;            // one packed projection, its weight and bias taken as they are
  std::vector<float> weights[3];  // separate projections: [H_in, H] each, packed into one at emission
  std::vector<float> biases[3];
  std::vector<float> out_weight;  // sequence-first: the output projection [H, H]
};
MatchResult<AttentionPlan> PlanAttention(const Graph& graph, const ShapeInfo& shapes, const AttentionMatch& match);
void EmitAttention(Graph& graph, const AttentionMatch& match, const AttentionPlan& plan, FusionState* state,
                   PassContext& context);

// MultiHeadAttention.
MatchResult<Replacement> PlanMultiHeadAttention(const Graph& graph, const ShapeInfo& shapes,
                                                const AttentionMatch& match);
void EmitMultiHeadAttention(Graph& graph, const AttentionMatch& match, const Replacement& plan, FusionState* state,
                            PassContext& context);

// GroupQueryAttention over MultiHeadAttention's pattern; `match` is grouped, its mask never lets a
// query see a later key.
bool GroupQueryAttentionFits(const AttentionMatch& match);
void EmitGroupQueryAttention(Graph& graph, const AttentionMatch& match, const Replacement& plan, FusionState* state,
                             PassContext& context);

// A projection [B,S,H] as the fused operators read it: the value the head split reshapes, or the head
// norm's output merged back (a Reshape added to `chain`).
std::string ProjectedValue(Graph& graph, const Projection& p, NodeChain* chain);

// Q and K as MultiHeadAttention and GroupQueryAttention read them, rotated on the [B,S,H] projections
// (K on its own key/value heads), added to `chain`.
std::pair<std::string, std::string> RotatedQueryAndKey(Graph& graph, const AttentionMatch& match, NodeChain* chain);

// The bias Where(cond, 0, lowest) for a mask whose meaning is a bias (MaskPlan::bias_condition; made
// once per condition and shared by the layers that read it), or the plan's float bias, or "" for none;
// added after the chain's last node. Where the scores were clamped (Scores::clamp, older transformers'
// max(scores + mask, finfo.min) over a mask that sums to -inf), the float bias is clamped at the lowest
// float instead, once per bias: ONNX Runtime's fused kernels take no -inf in attention_bias
// (MultiHeadAttention's CPU kernel then gets the rows that hold it wrong, measured), and the clamp
// changes nothing else.
std::string AttentionBias(Graph& graph, const AttentionMatch& match, FusionState* state, NodeChain* chain);

// A decoder with a cache (per layer or stacked) and a padding mask: a query whose every visible key is
// padding (left padding longer than the past) gets a softmax over masked scores only. The original's
// mask may replace those scores (a Where, a clamp at finfo.min) or add -inf (then a NaN guard), while the
// fused operators add their bias, so that row's values are whatever each computes; no unmasked position
// reads it. Counts `rows_masked_entirely_differ`, with which parity leaves such queries out (once noted).
void CountRowsMaskedEntirely(const AttentionMatch& match, const Node& fused, FusionState* state,
                             PassContext& context);

}  // namespace onnxopt::attention

#endif  // ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_EMIT_H_
