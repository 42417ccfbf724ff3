// One self-attention block, matched once in every form the exporters write; the emitters
// (attention_emit.h) write it as ONNX Runtime's Attention or MultiHeadAttention.
//
// Read upwards from its Softmax:
//   scores   Q*K^T, scaled (Div/Mul after it, or on Q and/or K before it), with an additive mask term
//            and/or a causal Where over a sliced lower-triangular buffer (attention_scores.cc);
//   context  MatMul(probs, V) merged back to [B,S,H] (attention_context.cc), after the SDPA path's
//            NaN guard Where(IsNaN(p), 0, p);
//   heads    Q, K and V from head-split projections, Add(MatMul(x, W), b) [-> packed part] -> Reshape
//            -> Transposes, K with its K^T transposes; Q and K possibly rotated (rotary.h), K and V
//            possibly repeated to the query heads (grouped-query attention) (attention_heads.cc);
//   mask     what the mask term means (attention_masks.h probes boolean masks in ONNX Runtime).
// Layouts: batch-first heads [B,N,S,D] (BERT, GPT-2, LLaMA) and torch.nn.MultiheadAttention's
// sequence-first [B*N,S,D] heads of an [S,B,H] input (torchvision's ViT).
#ifndef ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MATCH_H_
#define ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MATCH_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "optimizer/graph.h"
#include "optimizer/pass.h"
#include "optimizer/passes/fusion/attention_masks.h"
#include "optimizer/passes/fusion/rotary.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/rewrite.h"
#include "optimizer/shape_info.h"

namespace onnxopt::attention {

using Perm = std::vector<int64_t>;

enum class Layout { kBatchFirst, kSequenceFirst };

// One of Q, K, V: Add(MatMul(x, W), b) [+ LoRA branch] [-> part of a packed projection] [-> * c]
// [-> norm] -> Reshape [-> norm of each head] -> Transposes. The scalar c is Whisper's `q_proj(x) * scaling` before the head split; the
// LoRA branch is peft's unmerged adapter, [Mul(] MatMul(MatMul(x, A), B) [, s)], added to the base.
struct Projection {
  Node* matmul = nullptr;
  Node* add = nullptr;
  Node* part = nullptr;  // packed Q/K/V: the Split or Slice taking this part
  int64_t offset = -1;   // packed: where this part starts in the packed projection's last axis
  int64_t size = -1;     // packed: its width
  Node* scaling = nullptr;  // the Mul or Div by c, when there is one
  float scale = 1.0f;       // c
  Node* lora_add = nullptr;  // the Add of a LoRA branch onto the base projection, when there is one
  // Qwen3 / Gemma 3: (Simplified)LayerNormalization over each head's D between the head split and the
  // transpose; it stays, on the heads the Reshape makes.
  Node* head_norm = nullptr;
  // OLMo 2: the same norm over the whole projection (before the head split); it stays too.
  Node* projection_norm = nullptr;
  // The heads [B,S,N,D] as the transpose reads them: the head split's, or the head norm's.
  const std::string& SplitHeads() const { return head_norm != nullptr ? head_norm->output(0) : reshape->output(0); }
  Node* reshape = nullptr;
  std::vector<Node*> transposes;
  std::string x, weight, bias;  // bias empty: the projection has none
  // The heads [B,N,S,D] as the graph computes them, where what computes them is not understood (a
  // rotation in an unknown form): the attention core fuses over them and the rest stays as it is.
  // Everything above is empty then.
  std::string given_heads;
  // K only: given_heads is K^T [B,N,D,T] as the scores read it (DiT's pre-transposed keys), not K.
  bool given_transposed = false;
  bool Given() const { return !given_heads.empty(); }
};

// transformers' repeat_kv for grouped-query attention: KV heads [B,Nkv,S,D] each read by `rep` query
// heads, as Reshape(Expand(Unsqueeze(kv, [2]), [B,Nkv,rep,S,D]), [B,Nkv*rep,S,D]), or with
// Tile(.., [1,1,rep,1,1]) for the Expand (Tensor.repeat).
struct KvRepeat {
  std::vector<Node*> nodes;  // Unsqueeze, Expand or Tile, Reshape
  std::string kv_heads;      // [B,Nkv,S,D]
  int64_t kv_heads_count = 0, rep = 0;
};

// A key/value cache (a decoder exported for generation): K and V are Concat(past, new) on the sequence
// axis of [B,Nkv,*,D], past a graph input, the concatenations the present outputs (cache_interface.h).
struct KvCache {
  Node* key_concat = nullptr;
  Node* value_concat = nullptr;
  std::string past_key, past_value;  // the graph inputs
};

// GPT-2's cache as transformers wrote it before its Cache classes, one tensor for keys and values:
//   past [2,B,N,P,D] -> Split(axis 0) -> Squeeze(0) each (or Gather(past, 0|1, axis 0))
//   k_all = Concat(past_k, k, axis -2); v_all = Concat(past_v, v, axis -2); K^T = Transpose(k_all, 0,1,3,2)
//   present = Concat(Unsqueeze(k_all, 0), Unsqueeze(v_all, 0), axis 0) [2,B,N,P+S,D]
// which is ONNX Runtime's Attention's own past and present.
struct StackedCache {
  std::string past;     // the graph input
  std::string present;  // the graph output, or "" where the graph writes none
  std::vector<Node*> nodes;  // from the past's Split to the present's Concat: they go with the pattern
};

// What feeds the Softmax: Q*K^T, scaled, with an additive mask and/or a causal Where (either order).
struct Scores {
  Node* qk = nullptr;
  Node* post_scale = nullptr;     // Div/Mul after Q*K^T
  std::vector<Node*> pre_scales;  // Div/Mul on Q and/or K before it
  std::string q_heads, k_heads;   // Q*K^T's inputs before pre-scaling
  float scale = 1.0f;
  Node* causal_where = nullptr;
  Node* mask_add = nullptr;
  std::string mask_term;
  // Max(masked scores, c), c <= -1e4: the clamp older transformers put after an additive mask that may
  // reach -inf. It changes only scores the mask removes (and rows masked entirely, to uniform ones,
  // as the fused operators' finite mask value does).
  Node* clamp = nullptr;
};

// Where the context goes after MatMul(probs, v), back to [B,S,H].
struct ContextOutput {
  Node* matmul = nullptr;        // MatMul(probs, v)
  std::vector<Node*> nodes;      // the merge (and for sequence-first: output projection) chain
  std::vector<Node*> reshapes;   // Reshapes among them (their shape inputs may be pattern arithmetic)
  std::string output;            // the [B,S,H] value the fused node replaces
  bool flattened = false;        // batch-first: `output` is [B*S, H] (a Reshape follows the fused node)
  int64_t flat_width = 0;        // flattened: that H
  // Sequence-first only: the output projection, applied after the fused node.
  std::string out_weight, out_bias;
  bool out_weight_transposed = false;  // Gemm transB
};

// How the fused operator masks the scores.
struct MaskPlan {
  std::string raw_mask;        // a [B, T] key padding mask (0: masked): mask_index / key_padding_mask
  bool raw_mask_inverted = false;  // raw_mask is non-zero where masked (the fusion negates it)
  float filter = -10000.0f;    // what masked scores become (mask_filter_value)
  bool causal = false;         // unidirectional
  std::string bias;            // a float [B|1, N|1, S, T] term added to the scores: attention_bias
  std::string bias_condition;  // a boolean mask the emitter turns into Where(cond, 0, lowest) as the bias
  // bias_condition [B|1, 1, S, T] filled with -inf behind the SDPA path's NaN guard: a row it masks
  // entirely (a local window over padding only) is 0 in the original, the mean of V in the fused
  // operator's finite bias; the emitters zero those rows (FinishAttentionOutput).
  bool zero_masked_rows = false;
  // The mask never lets a query see a later key (the probe's MaskMeaning::within_causal, or causal):
  // a causal kernel (GroupQueryAttention) takes the rest as a bias.
  bool within_causal = false;
  // `bias` is an additive mask (0 or at most -1e4 everywhere) that, probed, never lets a query see a
  // later key: a causal kernel takes it as its bias too.
  bool bias_within_causal = false;
  // The plan reads a float additive mask by its probed meaning (PlanBooleanMask's additive form).
  bool additive = false;
  // zero_masked_rows: the boolean condition [B|1, 1, S, T] that tells the rows (bias_condition, or the
  // causal + padding mask whose left padding masks a row entirely).
  std::string row_condition;
  // A sliding window (MaskMeaning::kSlidingWindow*): each query sees its last `window` keys counting
  // itself, and the keys `window_padding` (a [B, T] input, or "" for none) keeps. GroupQueryAttention
  // takes that as local_window_size and the padding's bias; the other operators take bias_condition.
  int64_t window = 0;
  std::string window_padding;
};

// What one pass run builds once and every attention block of the graph reuses.
struct FusionState {
  CastCache int32_masks{onnx::TensorProto::INT32};  // raw mask -> its int32 Cast
  std::map<std::string, std::string> padding_biases;  // raw mask -> its [B, 1, S, T] bias (GroupQueryAttention)
  std::map<std::string, std::string> condition_biases;  // boolean condition -> Where(cond, 0, lowest)
  std::map<std::string, std::string> finite_biases;     // a clamped float bias -> Max(bias, lowest)
  std::map<std::string, std::string> kept_rows;
  // A raw mask [B, 1, (1,) T] (and whether it is true on padding) -> the [B, T] mask, 0 where masked.
  std::map<std::pair<std::string, bool>, std::string> raw_masks_2d;  // row condition -> [B|1, S, 1] float, 0 where masked entirely
  bool cache_noted = false;  // the report says once what a fused cache does not take
  bool rows_masked_entirely_noted = false;  // ... and that a query seeing only padding is left to each kernel
  int64_t packed_projection_bytes = 0;  // the packed Q/K/V weights GroupQueryAttention took so far
  bool packing_limit_noted = false;     // the report says once that they reached their limit
  std::set<std::string> kept_noted;  // AttentionMatch::kept_neighbour reasons the report gave
  MaskProbes probes;
};

// One attention block: everything an emitter needs, found once.
struct AttentionMatch {
  Layout layout = Layout::kBatchFirst;
  Node* softmax = nullptr;
  Scores scores;
  // After Softmax, going with the pattern: the SDPA path's NaN guard Where(IsNaN(p), 0, p), or a
  // masked_fill(m, 0) (MatchZeroedProbs).
  std::vector<Node*> nan_guard;
  // masked_fill(m, 0) after the Softmax (ESPnet's, WeNet's and NeMo's attention): Where(m, 0, p), or
  // Where(a, p, 0) over the allowed positions a (`zeroed_where_true` false). MatchMask checks that it is
  // the mask's own condition; the rows that mask masks entirely are then 0, whatever its fill
  // (MaskPlan::zero_masked_rows), and the masked positions are 0 already.
  std::string zeroed_condition;
  bool zeroed_where_true = true;
  ContextOutput out;  // out.matmul is MatMul(probs, V)
  Node* k_swap = nullptr;  // batch-first K^T over rotated or repeated K: Transpose(0,1,3,2)
  Projection q, k, v;
  std::optional<Rotation> q_rotation, k_rotation;
  std::optional<KvRepeat> k_repeat, v_repeat;
  std::optional<KvCache> cache;
  std::optional<StackedCache> stacked_cache;  // only with Q, K and V head-split projections of one input
  // A decoder's first step without a past (Optimum's decoder_model, a merged decoder's branch without
  // the cache) writes this step's K and V heads (maybe repeated) as its presents: those graph outputs
  // stay, with the nodes computing them, beside the fused operator.
  std::set<std::string> fresh_presents;
  // K and V go to MultiHeadAttention as the graph's heads [B,N,T,D] (its BNSH key and value) instead of
  // merged back to [B,T,H]: set over a cache's repeated heads (OverComputedHeads) and for heads that are
  // graph inputs (an encoder-decoder's encoder keys and values), where merging would copy them at every
  // decode step.
  bool kv_in_heads_layout = false;
  MaskPlan mask;
  int64_t hidden = 0, num_heads = 0, head_size = 0;
  // V's width where its separate projection differs from Q's and K's (a pruned model; ONNX Runtime's
  // Attention takes it as qkv_hidden_sizes); 0 when all three are `hidden` wide.
  int64_t v_hidden = 0;
  // The context's width: V's.
  int64_t OutputWidth() const { return v_hidden > 0 ? v_hidden : hidden; }
  // Given heads (Projection::given_heads): why the pieces that compute them were not taken in.
  std::string kept_neighbour;

  // Q and K rotated, K and V repeated, a projection with a LoRA branch or a head norm (which must stay
  // as they are), or K and V projected from another input than Q: only MultiHeadAttention (projections
  // outside) can take them.
  bool NeedsProjectionsOutside() const {
    bool kept_parts = false;
    for (const Projection* p : {&q, &k, &v}) {
      kept_parts |= p->lora_add != nullptr || p->head_norm != nullptr || p->projection_norm != nullptr || p->Given();
    }
    // Cross-attention (K and V projections of another input than Q's, an encoder's output): only
    // MultiHeadAttention takes Q, K and V apart; Attention projects one input.
    const bool cross = !q.Given() && (q.x != k.x || q.x != v.x);
    return q_rotation.has_value() || k_repeat.has_value() || cache.has_value() || kept_parts || cross;
  }
  int64_t kv_repeat() const { return k_repeat ? k_repeat->rep : 1; }
};

// The attention block whose scores feed `softmax`; a failure with a reason is worth a skip line.
MatchResult<AttentionMatch> MatchAttention(const Graph& graph, Node* softmax, const ShapeInfo& shapes,
                                           const PassContext& context);

// --- The parts (attention_heads.cc, attention_scores.cc, attention_context.cc) ---

// Follows `head_value` back through Transposes with the given perms (last first), a Reshape, an
// optional packed part and Add(MatMul(x, W), b).
MatchResult<Projection> MatchProjection(const Graph& graph, const ShapeInfo& shapes, const std::string& head_value,
                                        const std::vector<Perm>& perms);

// Q, K and V of `match` (whose scores and context are matched) from their heads.
MatchResult<Matched> MatchHeads(const Graph& graph, const ShapeInfo& shapes, AttentionMatch* match);

// Q, K and V of a batch-first `match` as the heads [B,N,S,D] the scores and context read (K under its
// K^T transpose; K and V possibly repeated to the query heads or read from a cache), with N and D from
// their shapes (N else the configured number of heads): the fallback where MatchHeads does not
// understand what computes them. With `repeated_as_given`, K and V are taken as the scores and context
// read them, after a repeat and a cache's Concat (which then stay outside the fused operator).
MatchResult<Matched> MatchGivenHeads(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                     AttentionMatch* match, bool repeated_as_given = false);

// `match` (fully matched, unmodified by an emitter) again over the heads as the scores and context read
// them: Q as given, K and V after their repeat and cache, which stay in the graph; `reason` says why
// (the report's note). For a cache the grouped-query operator cannot take, the core still fuses.
MatchResult<Matched> OverComputedHeads(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                       const std::string& reason, AttentionMatch* match);

// N and D of the attention: what Q's split shows, else the configured number of heads.
MatchResult<Matched> MatchHeadCounts(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                     AttentionMatch* match);

MatchResult<Scores> MatchScores(const Graph& graph, const ShapeInfo& shapes, Node* softmax);

// The guard transformers puts after Softmax for rows that mask every position: Where(IsNaN(p), 0, p).
// The fused operators' finite mask value never makes such rows NaN, so the guard goes with the pattern.
std::vector<Node*> MatchNanGuard(const Graph& graph, Node* softmax);

// masked_fill(m, 0) on the probabilities: sets match->zeroed_condition (and polarity) and returns the
// Where, or nullptr. Read by nothing but the context's MatMul.
Node* MatchZeroedProbs(const Graph& graph, Node* softmax, AttentionMatch* match);

MatchResult<ContextOutput> MatchContext(const Graph& graph, const ShapeInfo& shapes, Layout layout,
                                        Node* context_matmul);

// The boolean mask term `Where(cond, 0, fill)` with fill -inf or below -1e4: cond.
std::optional<std::string> BooleanMaskCondition(const Graph& graph, const std::string& term);

// What the scores' mask term (and causal Where) mean, as the fused operators take it:
// - the boolean `Where(cond, 0, fill)` (fill -inf or below -1e4) masking_utils writes for SDPA and
//   eager attention: cond probed (attention_masks.h). All true: no mask. Key padding of a [B, T]
//   input: that input is the raw mask. Causal (alone or with padding): unidirectional. Another
//   meaning: the condition as a bias (Where(cond, 0, lowest)) when it is shaped like one. -inf
//   becomes the lowest float, which gives the same probabilities wherever a row keeps any position;
// - the additive `(1 - Cast(Unsqueeze(mask[B,S], [1,2]))) * c`: the raw mask and c;
// - any other float term [B|1, N|1, S, T] with the scores' S and T (T5's position bias): the bias.
MatchResult<MaskPlan> MatchMask(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                const AttentionMatch& match, FusionState* state);

// --- The pattern a fused operator replaces ---

// The nodes every fused form removes: scores (their mask Add, clamp and causal Where), Softmax and its
// guard, the context and its merge.
std::vector<Node*> CorePattern(const AttentionMatch& match);

// The causal buffer's Slices (GPT-2's bias[:, :, :S, :S]) join `pattern` and `targets` (their ends read
// the scores' shape) where nothing outside the pattern reads them (layers may share one after CSE).
void ClaimCausalBuffer(const Graph& graph, const AttentionMatch& match, std::vector<Node*>* pattern,
                       std::set<Node*>* targets);

// Checks that every value of `pattern` but the block's output is read only inside it, or by shape
// arithmetic feeding the shape inputs of `targets` (Reshapes and Slices of the pattern); that shape
// arithmetic is returned, to go with the pattern. Values in `reproduced` (a cache's presents, which the
// fused node writes again) may be graph outputs.
MatchResult<std::vector<Node*>> ClaimPattern(const Graph& graph, const std::vector<Node*>& pattern,
                                             const std::set<Node*>& targets, const std::string& output,
                                             const std::set<std::string>& reproduced = {});

// Removes the pattern and its shape arithmetic; returns where the fused node goes (after the last
// node of the context's merge).
const Node* RemovePattern(Graph& graph, const AttentionMatch& match, const std::vector<Node*>& pattern,
                          const std::vector<Node*>& shape_nodes);

// After a batch-first fused node writing `attended` [B,S,H] (not the block's output itself where either
// applies): the rows the mask masks entirely set to 0 where the plan asks (MaskPlan::zero_masked_rows),
// and the result flattened to [B*S, H] where the context was; written to the block's output.
void FinishAttentionOutput(Graph& graph, const PassContext& context, const AttentionMatch& match,
                           const std::string& attended, const Node* fused, FusionState* state);
// True if the fused node cannot write the block's output itself (FinishAttentionOutput adds nodes).
inline bool NeedsFinishing(const AttentionMatch& match) { return match.out.flattened || match.mask.zero_masked_rows; }

// After a fused node writing `attended` [B,S,H]: Reshape it to `output` [B*S, H] for the Gemm that read
// the flattened context.
void AddFlatten(Graph& graph, const std::string& attended, const std::string& output, int64_t hidden, const Node* after);

}  // namespace onnxopt::attention

#endif  // ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MATCH_H_
