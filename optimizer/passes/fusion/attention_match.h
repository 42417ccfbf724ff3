// The pieces every self-attention block is made of, each recognized in the forms exporters write:
// head-split projections, the scores with their scale and masks, the context merged back to [B,S,H],
// the NaN guard, and the check that nothing outside the pattern reads what the fusion removes.
// Shared by fuse_attention.cc (com.microsoft::Attention) and fuse_rotary_attention.cc
// (MultiHeadAttention with RotaryEmbedding); the pass header in fuse_attention.cc lists the forms.
#ifndef ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MATCH_H_
#define ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MATCH_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "optimizer/graph.h"
#include "optimizer/pass.h"
#include "optimizer/passes/canonical/attention_masks.h"
#include "optimizer/shape_info.h"

namespace onnxopt::attention {

using Perm = std::vector<int64_t>;

// Heads laid out [B,N,S,D] (BERT, GPT-2) or [B*N,S,D] from a sequence-first [S,B,H] projection
// (torch.nn.MultiheadAttention).
enum class Layout { kBatchFirst, kSequenceFirst };

// One of Q, K, V: Add(MatMul(x, W), b) [-> part of a packed projection] -> Reshape -> Transposes.
struct Projection {
  Node* matmul = nullptr;
  Node* add = nullptr;
  Node* part = nullptr;  // packed Q/K/V: the Split or Slice taking this part
  int64_t offset = -1;   // packed: where this part starts in the packed projection's last axis
  int64_t size = -1;     // packed: its width
  Node* reshape = nullptr;
  std::vector<Node*> transposes;
  std::string x, weight, bias;  // bias empty: the projection has none
};

// What feeds the Softmax: Q*K^T, scaled, with an additive mask and/or a causal Where (either order).
struct Scores {
  Node* qk = nullptr;
  Node* post_scale = nullptr;              // Div/Mul after Q*K^T
  std::vector<Node*> pre_scales;           // Div/Mul on Q and/or K before it
  std::string q_heads, k_heads;            // Q*K^T's inputs before pre-scaling
  float scale = 1.0f;
  Node* causal_where = nullptr;
  Node* mask_add = nullptr;
  std::string mask_term;
};

// What RotaryEmbedding reads besides the projection, built once per cos/sin table pair and shared
// by every layer that rotates with it.
struct RotaryInputs {
  std::string cos_cache, sin_cache, position_ids;
};

// What one run of fuse_attention builds once and every attention block of the graph reuses.
struct FusionState {
  std::unordered_map<std::string, std::string> int32_masks;  // raw mask -> its int32 Cast
  std::map<std::string, MaskMeaning> probed;                   // boolean mask -> what it means
  std::map<std::string, RotaryInputs> rotary_inputs;           // cos/sin tables -> RotaryEmbedding's inputs
};

// Where the context goes after MatMul(probs, v), back to [B,S,H].
struct ContextOutput {
  Node* matmul = nullptr;               // MatMul(probs, v)
  std::vector<Node*> nodes;             // the merge (and for sequence-first: output projection) chain
  std::vector<Node*> reshapes;          // Reshapes among them (their shape inputs may be pattern arithmetic)
  std::string output;                   // the [B,S,H] value the fused node replaces
  bool flattened = false;               // batch-first: `output` is [B*S, H] (a Reshape follows the fused node)
  int64_t flat_width = 0;               // flattened: that H
  // Sequence-first only: the output projection, applied after the fused node.
  std::string out_weight, out_bias;
  bool out_weight_transposed = false;   // Gemm transB
};

Perm PermOf(const Node* node);

// A Div or Mul by a scalar constant; its multiplier and the scaled input.
std::optional<std::pair<float, std::string>> ScalarScale(const Graph& graph, Node* node);

// Follows `head_value` back through Transposes with the given perms (last first), a Reshape, an
// optional packed part and Add(MatMul(x, W), b).
bool MatchProjection(const Graph& graph, const ShapeInfo& shapes, const std::string& head_value,
                     const std::vector<Perm>& perms, Projection* projection);

bool MatchHeads(const Graph& graph, const ShapeInfo& shapes, Layout layout, const std::string& q_heads,
                const std::string& k_heads, const std::string& v_heads, Projection* q, Projection* k, Projection* v);

bool MatchScores(const Graph& graph, const ShapeInfo& shapes, Node* softmax, Scores* scores, std::string* reason);

bool MatchContext(const Graph& graph, const ShapeInfo& shapes, Layout layout, Node* context_matmul, ContextOutput* out);

// The additive mask `(1 - Cast(Unsqueeze(mask[B,S], [1,2]))) * c`: the raw [B,S] mask and c.
bool MatchAdditiveMask(const Graph& graph, const ShapeInfo& shapes, const std::string& term, std::string* raw_mask,
                       float* filter, std::string* reason);

// The heads (N, D) a head-split Reshape shows: from its inferred output shape, else its constant
// target; the sequence-first [S, B*N, D] shows only D, and N = hidden / D.
std::optional<std::pair<int64_t, int64_t>> ShownHeads(const Graph& graph, const ShapeInfo& shapes, Layout layout,
                                                      const Node& reshape, int64_t hidden);

// N and D of the attention: what Q's split shows, else the configured number of heads.
bool HeadCounts(const Graph& graph, const ShapeInfo& shapes, const PassContext& context, Layout layout,
                const Projection& q, int64_t hidden, int64_t* num_heads, int64_t* head_size);

// The meaning of the boolean mask `cond`, probed once per pass run (masks are shared by layers).
const MaskMeaning& ProbeOnce(const Graph& graph, const PassContext& context, const std::string& cond,
                             std::map<std::string, MaskMeaning>* probed);

// The boolean mask `Where(cond, 0, fill)` (fill -inf or below -1e4), as masking_utils writes it for
// SDPA and eager attention: what cond means is probed (attention_masks.h). All true: no mask at all.
// A key-padding mask of a [B, T] input: that input is Attention's raw mask. Causal (alone or with
// padding): unidirectional. -inf becomes the lowest float, which gives the same probabilities wherever
// a row keeps any position.
bool MatchBooleanMask(const Graph& graph, const PassContext& context, const std::string& term,
                      std::map<std::string, MaskMeaning>* probed, std::string* raw_mask, float* filter,
                      bool* causal, std::string* reason);

// True if `term` can be ONNX Runtime's attention_bias for these scores: [B|1, N|1, S, T] with the
// scores' S and T (only the first two axes broadcast there).
bool FitsAttentionBias(const ShapeInfo& shapes, const std::string& term, const std::string& scores, int64_t heads);

// The guard transformers puts after Softmax for rows that mask every position: Where(IsNaN(p), 0, p).
// Attention's finite mask value never makes such rows NaN, so the guard goes with the pattern.
std::vector<Node*> MatchNanGuard(const Graph& graph, Node* softmax);

// True if every value the pattern computes, but `output`, is read only by pattern members or by shape
// arithmetic that feeds the `targets`' shape inputs (collected into shape_nodes, to go too).
bool OnlyReadInside(const Graph& graph, const std::vector<Node*>& pattern, const std::set<Node*>& members,
                    const std::set<Node*>& targets, const std::string& output, std::vector<Node*>* shape_nodes,
                    std::string* reason);

// After a fused node writing `attended` [B,S,H]: Reshape it to `output` [B*S, H] for the Gemm that read
// the flattened context.
void AddFlatten(Graph& graph, const std::string& attended, const std::string& output, int64_t hidden, const Node* after);

// The Slices that cut the causal mask out of its buffer, nearest first.
std::vector<Node*> CausalSlices(const Graph& graph, const std::string& cond);
}  // namespace onnxopt::attention

#endif  // ONNXOPT_OPTIMIZER_PASSES_FUSION_ATTENTION_MATCH_H_
