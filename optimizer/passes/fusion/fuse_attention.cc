// fuse_attention: self-attention, as exporters write it, becomes ONNX Runtime's com.microsoft::Attention,
// or MultiHeadAttention where the projections must stay outside (rotated Q and K, LoRA branches, Q/K
// norms), or GroupQueryAttention for grouped-query K and V.
//
// Before (BERT, GPT-2; batch-first heads):
//   q = Reshape(Add(MatMul(x, Wq), bq), [B,S,N,D]) -> Transpose(0,2,1,3)
//   k = ... -> Transpose(0,2,3,1)   (or (0,2,1,3) then (0,1,3,2))
//   v = ... -> Transpose(0,2,1,3)
//   p = Softmax(masks(scale(MatMul(q, k))), axis=-1);  y = Reshape(Transpose(MatMul(p, v), (0,2,1,3)), [B,S,H])
// Before (torch.nn.MultiheadAttention, e.g. torchvision's ViT; sequence-first heads):
//   t = Transpose(x, (1,0,2)); qkv = Add(MatMul(t, W[H,3H]), b[3H]); q/k/v = three Slices of qkv
//   q = Transpose(Reshape(q, [S, B*N, D]), (1,0,2)) / sqrt(D); k -> Transpose(1,2,0); v -> Transpose(1,0,2)
//   c = Reshape(Transpose(MatMul(Softmax(MatMul(q, k)), v), (1,0,2)), [S*B, H]);
//   y = Transpose(Reshape(Gemm(c, Wo, bo, transB=1), [S,B,H]), (1,0,2))
// Before (LLaMA: rotary embeddings between the projections and the scores, grouped-query K and V):
//   q = rope(Transpose(Reshape(x Wq, [B,S,N,D]))); k = repeat_kv(rope(...)); v = repeat_kv(...)
// After:
//   y = Attention(x, [Wq|Wk|Wv], [bq|bk|bv], Cast(mask, int32), num_heads=N, scale, unidirectional,
//                 mask_filter_value, attention_bias)   (followed by MatMul(Wo^T) + bo for the sequence-first form)
//   y = MultiHeadAttention(rope'(x Wq), rope'(x Wk), x Wv, key_padding_mask, attention_bias)  (rotated Q, K;
//       or projections with a LoRA branch, x Wq + s (x A) B, kept as they are)
//   y = GroupQueryAttention(rope'(x Wq), rope'(x Wk), x Wv, ..., attention_bias)   (grouped K/V, a mask within
//       the causal one; see below)
//
// A key/value cache (a decoder exported for generation, cache_interface.h): K and V are Concat(past, new)
// on the sequence axis and those Concats are the present outputs:
//   k = Concat(past_k, rope(Transpose(Reshape(x Wk)))) -> present.k; v = Concat(past_v, ...) -> present.v
//   y = context(Softmax(q k'^T + Where(cond, 0, -inf)) with k', v' = repeat_kv(present.k, present.v)
// becomes
//   y, present.k, present.v = GroupQueryAttention(rope'(x Wq), rope'(x Wk), x Wv, past_k, past_v,
//                                                 seqlens_k = T - 1 per row, T = P + S, attention_bias)
// with the inputs and outputs of the model unchanged (an unchanged generation loop runs it). Exact for
// any padding: every row is taken as T long (the kernel writes the new keys at P for every row, as the
// Concat does, and sees keys up to P + i for query i, as the causal mask does), and the padding goes in
// as attention_bias; rows left padding masks entirely are zeroed as the NaN guard does. Per phase, by
// measurement (tests/bench/generation_benchmark.py, a 122M-parameter Qwen2-style decoder, 2 threads):
// GroupQueryAttention for prefill (1.08x the original at 128 tokens: both are GEMM-bound) and decode
// (1.15x at batch 1 / past 512, the float32 weights' stream bounding both; 2.79x at batch 4 / past
// 2048, where repeat_kv's copies of the cache dominate the original). MultiHeadAttention cannot take a
// grouped cache (its past and present have the query's heads), so it is not an alternative there.
// Limits: ONNX Runtime's kernel refuses a chunk after a past (S > 1 and P > 0) at batch > 1, which the
// original runs (prefill without a past and one-token decode steps, what generation loops do, are not
// affected); its CUDA kernel takes no attention_bias, so with padding the cache is fused on CPU jobs only.
//
// GPT-2's stacked cache (transformers 3.x, ONNX Runtime's own GPT-2 export): one past [2,B,N,P,D] and one
// present a layer, the causal buffer cut at the past's offset:
//   k_all = Concat(Gather(past, 0), k) (or K^T = Concat(Transpose(Gather(past, 0)), k^T, axis -1));
//   v_all = Concat(Gather(past, 1), v); present = Concat(Unsqueeze(k_all, 0), Unsqueeze(v_all, 0));
//   scores = Where(bias[:, :, T-S:T, :T], q k_all^T / sqrt(D), -1e4) + (1 - mask[B,T]) * -1e4
// becomes
//   y, present = Attention(x, [Wq|Wk|Wv], [bq|bk|bv], Cast(mask, int32), past, unidirectional=1)
// ONNX Runtime's Attention takes exactly that layout and counts the causal mask from the past. The same
// wherever a query sees a key its mask keeps; a query that sees only padding (left padding longer than
// the past) gets another softmax over its masked keys (the original replaces the scores of later keys,
// Attention adds to them), which no unmasked position reads: the pass counts those layers and parity
// skips those queries (validation/parity.h).
//
// Grouped-query attention on the CPU: GroupQueryAttention by default (grouped_query: auto), measured
// against MultiHeadAttention with K and V repeated (tests/bench/grouped_query_choice.py: LLaMA blocks
// of hidden 512 / 8 heads / 2 KV heads and 896 / 14 / 2, causal, sequence 128, 2 threads: GQA 1.4-2.1%
// faster at batch 1 and 4, four of four pairs; equal within noise on the 64-wide HF exports) and it
// never materializes the repeated K and V. On CUDA jobs MultiHeadAttention stays (not measured there yet).
//
// Layered: fuse_rotary_embedding turns the rotations into RotaryEmbedding first; this pass matches a
// block once (attention_match.h: forms of projections, scale, masks, context) and hands it to the
// emitter that fits (attention_emit.h). Masks: additive `(1 - mask[B,S]) * c` (c = -10000 or
// finfo.min), causal Where over a sliced lower-triangular buffer, in either order, and the boolean
// `Where(cond, 0, -inf or finfo.min)` that Hugging Face transformers 5 builds for its SDPA and eager
// paths, whatever its spelling: cond is probed in ONNX Runtime (attention_masks.h) and taken when it
// is all true (no mask: ViT), a key-padding mask of one [B, T] input (BERT, RoBERTa), causal, or causal
// with key padding (GPT-2), else as a bias. Any other float term added to the scores is probed the same
// way as an additive mask (every value 0 or at most -1e4, kept where 0: older transformers'
// clamp(triu(P+1) causal + (1 - mask) * finfo.min)), and taken by its meaning (GroupQueryAttention for
// grouped K/V with a cache: measured on Mistral-7B's layer shape, int4 decode at batch 4 / past 2048 went
// from 1.43x to 2.61x the original against MultiHeadAttention over the repeated heads); where it means
// nothing else, or the keys may outnumber the queries, it is the bias as it is (T5's position bias,
// exact). The SDPA path's NaN guard after Softmax,
// Where(IsNaN(p), 0, p), goes with the pattern: it only acts on rows that mask every position, where
// the original gives zeros and the fused operator the mean of V (padding-only sequences); so does a
// `masked_fill(mask, 0)` of the probabilities (ESPnet's, WeNet's and NeMo's Conformers), taken where it
// zeroes what the mask masks, with the rows the mask masks entirely zeroed after the operator. A float term
// beside a boolean mask (their relative-position term) is the operator's attention_bias with the mask's
// own bias or key padding; a [B, 1, T] or [B, 1, 1, T] mask input (or one true on padding) is the key
// padding, squeezed (negated) once. Where Attention cannot pack the projections (one is read outside the
// block: the position term reads Q's), MultiHeadAttention takes them as they are. Checked: N
// and D from inferred shapes or constant Reshape targets (else the config's num_heads); exact
// permutations; Softmax on the last axis; every buffer element of a causal mask; the causal slice's
// shape equal to the scores'; and no reader outside the pattern but shape arithmetic feeding the
// pattern's own Reshapes, which goes with it. Attention's raw mask treats 0 as masked, so masks must
// hold 0/1.
#include "absl/strings/str_cat.h"
#include "optimizer/passes/fusion/attention_emit.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

using namespace attention;  // NOLINT(build/namespaces): the pass is written in the matchers' terms

// The mask of `match`, probed in ONNX Runtime (after the emitter's cheap checks). A raw mask [B, 1, T]
// (WeNet's, ESPnet's) or [B, 1, 1, T] is squeezed to the [B, T] the operators take, and one true on
// padding negated, once for every layer, at the start of the graph (it reads a graph input).
MatchResult<Matched> WithMask(Graph& graph, const ShapeInfo& shapes, const PassContext& context, FusionState* state,
                              AttentionMatch* match) {
  MatchResult<MaskPlan> mask = MatchMask(graph, shapes, context, *match, state);
  if (!mask) return mask.failure();
  match->mask = *std::move(mask);
  std::string& raw = match->mask.raw_mask;
  const int rank = shapes.Rank(raw).value_or(2);
  if (raw.empty() || (rank <= 2 && !match->mask.raw_mask_inverted)) return Matched{};
  std::string& made = state->raw_masks_2d[{raw, match->mask.raw_mask_inverted}];
  if (made.empty()) {
    const std::vector<Node*> nodes = graph.Nodes();
    NodeChain chain(graph, nodes.empty() ? nullptr : nodes.front());
    std::string value = raw;
    if (rank > 2) {
      const std::vector<int64_t> axes = rank == 3 ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2};
      value = context.OpsetVersion("") >= 13
                  ? chain.Add("Squeeze", {value, AddInt64Initializer(graph, "mask_keys_axes", axes)}, "mask_keys")
                  : chain.Add("Squeeze", {value}, "mask_keys", {MakeIntsAttribute("axes", axes)});
    }
    if (match->mask.raw_mask_inverted) {
      const auto type = shapes.ElementType(raw);
      if (type == onnx::TensorProto::BOOL) {
        value = chain.Add("Not", {value}, "mask_kept");
      } else if (type == onnx::TensorProto::INT64 || type == onnx::TensorProto::INT32) {
        const std::string zero = graph.UniqueName("mask_padding_zero");
        graph.AddInitializer(MakeIntScalar(zero, *type, 0));
        value = chain.Add("Equal", {value, zero}, "mask_kept");
      } else {
        return Fail("a padding mask true on padding, of a type other than bool, int32 or int64");
      }
    }
    made = value;
  }
  raw = made;
  return Matched{};
}

// MultiHeadAttention's unidirectional is the causal mask only where the keys are as many as the queries
// or the past is its own past_key: over longer keys it is given (a cache's Concat the graph computes, a
// chunk after a past) it masks the rows of the chunk from key 0 and leaves the last row whole (measured:
// MultiHeadAttention(q [1, 3, H], k [1, 7, H], unidirectional=1) sees keys j <= i in rows 0 and 1 and every
// key in row 2). Where the scores' query and key lengths are not known to be one, a boolean causal mask
// goes in as its condition's bias instead (exact at any lengths); another causal mask is refused.
MatchResult<Matched> CausalOverLongerKeys(const Graph& graph, const ShapeInfo& shapes, const PassContext& context,
                                          FusionState* state, AttentionMatch* match) {
  const std::string& scores = match->softmax->input(0);
  if (!match->mask.causal || shapes.SameDim(scores, -1, scores, -2)) return Matched{};
  if (match->mask.additive && match->scores.mask_add != nullptr && match->scores.causal_where == nullptr) {
    // A float additive mask read by its meaning: the float mask itself, as the bias, is exact (with no
    // causal buffer beside it, whose causality the bias would not carry).
    MaskPlan bias;
    bias.bias = match->scores.mask_term;
    match->mask = bias;
    return Matched{};
  }
  std::optional<std::string> cond;
  if (match->scores.causal_where == nullptr && match->scores.mask_add != nullptr) {
    cond = BooleanMaskCondition(graph, match->scores.mask_term);
  }
  if (!cond || !state->probes.Probe(graph, context, *cond).bias_shaped) {
    return Fail("a causal mask over keys that may outnumber the queries: MultiHeadAttention's unidirectional "
                "counts no past it is not given, and the mask is no boolean condition shaped as a bias");
  }
  match->mask.causal = false;
  match->mask.raw_mask.clear();  // the condition holds the padding too
  match->mask.bias_condition = *cond;
  return Matched{};
}

// MultiHeadAttention or GroupQueryAttention, the projections (and whatever follows them) outside.
MatchResult<Matched> FuseWithProjectionsOutside(Graph& graph, AttentionMatch& match, const ShapeInfo& shapes,
                                                PassContext& context, FusionState* state) {
  MatchResult<Replacement> plan = PlanMultiHeadAttention(graph, shapes, match);
  if (!plan) return plan.failure();
  if (MatchResult<Matched> masked = WithMask(graph, shapes, context, state, &match); !masked) {
    return Fail(match.q_rotation ? absl::StrCat("rotary attention: ", masked.reason()) : masked.reason());
  }
  const std::string& grouped = context.params().GetString("grouped_query");
  const bool group_query = grouped == "group_query" || (grouped == "auto" && context.hints().device != v1::DEVICE_CUDA);
  if (match.cache) {
    // Only GroupQueryAttention keeps the cache's key/value heads as they are (MultiHeadAttention's
    // past and present have the query's heads).
    if (grouped == "multi_head") {
      return Fail("a key/value cache: only GroupQueryAttention takes it (grouped_query is multi_head)");
    }
    if (!GroupQueryAttentionFits(match)) {
      return Fail("a key/value cache: GroupQueryAttention does not fit (head size not a multiple of 8, a "
                  "float bias, or a mask that lets a query see a later key)");
    }
    const bool padded = !match.mask.raw_mask.empty() || !match.mask.bias_condition.empty();
    if (context.hints().device == v1::DEVICE_CUDA && padded) {
      return Fail("a key/value cache with padding: GroupQueryAttention's CUDA kernel takes no attention_bias");
    }
    EmitGroupQueryAttention(graph, match, *plan, state, context);
  } else if (group_query && GroupQueryAttentionFits(match)) {
    EmitGroupQueryAttention(graph, match, *plan, state, context);
  } else {
    if (MatchResult<Matched> causal = CausalOverLongerKeys(graph, shapes, context, state, &match); !causal) {
      return causal.failure();
    }
    EmitMultiHeadAttention(graph, match, *plan, state, context);
  }
  return Matched{};
}

MatchResult<Matched> Fuse(Graph& graph, AttentionMatch match, const ShapeInfo& shapes, PassContext& context,
                          FusionState* state);

// A cache GroupQueryAttention cannot take (a float bias, a mask it cannot express, a head size its
// kernel refuses, `reason`): MultiHeadAttention over the heads the graph computes, the cache's Concats and
// the repeat of grouped K/V left as they are (the presents unchanged), the mask as its attention_bias.
// `match` is as matched, before an emitter planned it.
MatchResult<Matched> FuseOverComputedHeads(Graph& graph, AttentionMatch match, const ShapeInfo& shapes,
                                           PassContext& context, FusionState* state, const std::string& reason) {
  if (MatchResult<Matched> given = OverComputedHeads(graph, shapes, context, reason, &match); !given) return given;
  return Fuse(graph, std::move(match), shapes, context, state);
}

// Plans the operator that fits `match`, then its mask, then emits it.
MatchResult<Matched> Fuse(Graph& graph, AttentionMatch match, const ShapeInfo& shapes, PassContext& context,
                          FusionState* state) {
  if (!match.kept_neighbour.empty()) {
    std::optional<AttentionMatch> over_computed_heads;
    if (match.cache) over_computed_heads = match;  // before the emitter's planning changes it
    MatchResult<Matched> fused = FuseWithProjectionsOutside(graph, match, shapes, context, state);
    if (!fused) {
      std::string reason = absl::StrCat(match.kept_neighbour, "; over the heads as given: ", fused.reason());
      if (!over_computed_heads) return Fail(std::move(reason));
      return FuseOverComputedHeads(graph, std::move(*over_computed_heads), shapes, context, state, reason);
    }
    // Counted per block, said once per reason.
    context.Count("fused_over_given_heads");
    if (state->kept_noted.insert(match.kept_neighbour).second) {
      context.Note(absl::StrCat("attention fused over the heads as the graph computes them; what computes them ",
                                "stays as it is: ", match.kept_neighbour));
    }
    return fused;
  }
  if (match.NeedsProjectionsOutside()) {
    if (!match.cache) return FuseWithProjectionsOutside(graph, match, shapes, context, state);
    AttentionMatch over_computed_heads = match;  // before the emitter's planning changes it
    MatchResult<Matched> fused = FuseWithProjectionsOutside(graph, match, shapes, context, state);
    if (fused) return fused;
    return FuseOverComputedHeads(graph, std::move(over_computed_heads), shapes, context, state, fused.reason());
  }
  MatchResult<AttentionPlan> plan = PlanAttention(graph, shapes, match);
  if (!plan) {
    // Attention packs the projections; where one is read outside the block too (the position term of
    // relative-position attention reads Q's), MultiHeadAttention takes them as the graph computes them.
    if (match.layout == Layout::kBatchFirst) {
      AttentionMatch outside = match;
      if (FuseWithProjectionsOutside(graph, outside, shapes, context, state)) return Matched{};
    }
    return plan.failure();
  }
  if (MatchResult<Matched> masked = WithMask(graph, shapes, context, state, &match); !masked) return masked;
  EmitAttention(graph, match, *plan, state, context);
  return Matched{};
}

// Fuse, and where that fails for a block matched with its projections, the core over the heads the graph
// computes (K and V in their BNSH layout): a Whisper decoder's heads are its presents, read outside
// the block. The first failure is the one told when both fail.
MatchResult<Matched> FuseOrOverComputedHeads(Graph& graph, AttentionMatch match, const ShapeInfo& shapes,
                                             PassContext& context, FusionState* state) {
  std::optional<AttentionMatch> as_matched;
  if (!match.cache && !match.q.Given() && match.kept_neighbour.empty()) as_matched = match;
  MatchResult<Matched> fused = Fuse(graph, std::move(match), shapes, context, state);
  if (fused || !as_matched || fused.reason().empty()) return fused;
  MatchResult<Matched> over = FuseOverComputedHeads(graph, *std::move(as_matched), shapes, context, state, fused.reason());
  return over ? over : fused;
}

class FuseAttentionPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fuse_attention"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fuse self-attention (BERT/GPT-2 style, torch.nn.MultiheadAttention, LLaMA-style rotary and "
           "grouped-query; separate or packed Q/K/V, LoRA branches and Q/K norms kept; additive, causal, banded and "
           "boolean masks) into ONNX Runtime's Attention, MultiHeadAttention or GroupQueryAttention";
  }

  std::vector<ParamSpec> params() const override {
    return {{"grouped_query", ParamType::kString, "auto",
             "grouped-query attention (K and V shared by groups of query heads) as auto: GroupQueryAttention on CPU "
             "jobs and MultiHeadAttention on CUDA; multi_head: MultiHeadAttention with K and V repeated to the "
             "query heads; or group_query: GroupQueryAttention. GroupQueryAttention only where the mask never lets a "
             "query see a later key (causal, with padding or a window as its attention_bias); MultiHeadAttention "
             "elsewhere"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    const std::string& grouped = params.GetString("grouped_query");
    if (grouped != "auto" && grouped != "multi_head" && grouped != "group_query") {
      return absl::InvalidArgumentError(
          absl::StrCat("grouped_query: '", grouped, "' is not auto, multi_head or group_query"));
    }
    return absl::OkStatus();
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    FusionState state;
    for (Node* softmax : graph.Nodes()) {
      if (softmax->removed() || softmax->op_type() != "Softmax" || !softmax->domain().empty()) continue;
      MatchResult<AttentionMatch> match = MatchAttention(graph, softmax, shapes, context);
      MatchResult<Matched> fused =
          match ? FuseOrOverComputedHeads(graph, *std::move(match), shapes, context, &state) : match.failure();
      if (!fused && !fused.reason().empty()) context.Skip(absl::StrCat("fuse_attention: ", fused.reason()));
    }
    context.Count("mask_probes", state.probes.count());
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseAttentionPass() { return std::make_unique<FuseAttentionPass>(); }

}  // namespace onnxopt
