// fuse_attention: self-attention, as exporters write it, becomes ONNX Runtime's com.microsoft::Attention.
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
// After:
//   y = Attention(x, [Wq|Wk|Wv], [bq|bk|bv], Cast(mask, int32), num_heads=N, scale, unidirectional,
//                 mask_filter_value)   (followed by MatMul(Wo^T) + bo for the sequence-first form)
//
// Forms accepted: separate Q/K/V projections or one packed projection split by Split (sizes as input
// or attribute) or Slices; the scale as Div/Mul by a constant after Q*K or on Q (and/or K) before;
// masks: additive `(1 - mask[B,S]) * c` (c = -10000 or finfo.min), causal Where over a sliced
// lower-triangular buffer, in either order, and the boolean `Where(cond, 0, -inf or finfo.min)` that
// Hugging Face transformers 5 builds for its SDPA and eager paths, whatever its spelling: cond is
// probed in ONNX Runtime (attention_masks.h) and taken when it is all true (no mask: ViT), a
// key-padding mask of one [B, T] input (BERT, RoBERTa), causal, or causal with key padding (GPT-2). The SDPA path's NaN guard after Softmax,
// Where(IsNaN(p), 0, p), goes with the pattern: it only acts on rows that mask every position, where
// the original gives zeros and Attention the mean of V (padding-only sequences). Checked: one x; constant float weights; N and D from
// inferred shapes or constant Reshape targets (else the config's num_heads); exact permutations;
// Softmax on the last axis; every buffer element of a causal mask; the causal slice's shape equal to
// the scores'; and no reader outside the pattern but shape arithmetic feeding the pattern's own
// Reshapes, which goes with it. Attention's raw mask treats 0 as masked, so masks must hold 0/1.
//
// LLaMA-style attention (rotary position embeddings between the projections and the scores) is
// fused into MultiHeadAttention: fuse_rotary_attention.h. The matchers both use: attention_match.h.
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/canonical/attention_masks.h"
#include "optimizer/passes/fusion/attention_match.h"
#include "optimizer/passes/fusion/fuse_rotary_attention.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

using namespace attention;  // NOLINT(build/namespaces): the pass is written in the matchers' terms

class FuseAttentionPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_attention"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override {
    return "Fuse self-attention (BERT/GPT-2 style and torch.nn.MultiheadAttention; separate or packed Q/K/V, "
           "additive and causal masks) into ONNX Runtime's Attention";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    FusionState state;
    for (Node* softmax : graph.Nodes()) {
      if (softmax->removed() || softmax->op_type() != "Softmax" || !softmax->domain().empty()) continue;
      std::string reason;
      if (!TryFuse(graph, softmax, *shapes, context, &state, &reason) && !reason.empty()) {
        context.Skip(absl::StrCat("fuse_attention: ", reason));
      }
    }
    return absl::OkStatus();
  }

 private:
  static bool TryFuse(Graph& graph, Node* softmax, const ShapeInfo& shapes, PassContext& context,
                      FusionState* state, std::string* reason) {
    const auto rank = shapes.Rank(softmax->input(0));
    // Before opset 13 Softmax defaults to axis 1 (over everything after it, flattened).
    const int64_t axis = softmax->GetAttributeInt("axis", context.OpsetVersion("") < 13 ? 1 : -1);
    if (!rank || (*rank != 4 && *rank != 3) || (axis != -1 && axis != *rank - 1)) return false;
    const Layout layout = *rank == 4 ? Layout::kBatchFirst : Layout::kSequenceFirst;
    Scores scores;
    if (!MatchScores(graph, shapes, softmax, &scores, reason)) return false;
    const std::vector<Node*> nan_guard = MatchNanGuard(graph, softmax);
    const std::string probs = nan_guard.empty() ? softmax->output(0) : nan_guard.back()->output(0);
    Node* context_matmul = SoleConsumer(graph, probs);
    if (context_matmul == nullptr || context_matmul->op_type() != "MatMul" || context_matmul->input(0) != probs) {
      return false;
    }
    ContextOutput out;
    if (!MatchContext(graph, shapes, layout, context_matmul, &out)) {
      *reason = "the context is not merged back to [B,S,H]";
      return false;
    }
    Projection q, k, v;
    if (!MatchHeads(graph, shapes, layout, scores.q_heads, scores.k_heads, context_matmul->input(1), &q, &k, &v)) {
      if (layout == Layout::kBatchFirst && HasRotaryEmbedding(graph, scores.q_heads)) {
        return FuseRotaryAttention(graph, softmax, shapes, context, scores, nan_guard, context_matmul, out, state,
                                   reason);
      }
      *reason = "Q, K and V are not head-split projections";
      return false;
    }
    if (q.x != k.x || q.x != v.x) {
      *reason = "Q, K and V are not projections of one input";
      return false;
    }
    // The attention input: x itself, or for the sequence-first form the batch-first tensor it transposes.
    std::string input = q.x;
    Node* input_transpose = nullptr;
    if (layout == Layout::kSequenceFirst) {
      input_transpose = ProducerWithOp(graph, q.x, "Transpose");
      if (input_transpose == nullptr || PermOf(input_transpose) != Perm{1, 0, 2}) {
        *reason = "the sequence-first projections do not read a transposed batch-first input";
        return false;
      }
      input = input_transpose->input(0);
    }
    if (shapes.Rank(input).value_or(0) != 3) {
      *reason = "the attention input is not known to be 3-D";
      return false;
    }

    // Weights: one packed projection (Q|K|V parts in order) or three separate ones.
    const bool packed = q.part != nullptr;
    const onnx::TensorProto* q_weight = ConstantTensor(graph, q.weight);
    if (q_weight == nullptr || q_weight->dims_size() != 2) {
      *reason = "projection weights are not constant";
      return false;
    }
    const int64_t input_hidden = q_weight->dims(0);
    int64_t hidden = 0;
    std::vector<float> weights[3], biases[3];
    const Projection* projections[3] = {&q, &k, &v};
    if (packed) {
      const onnx::TensorProto* b = q.bias.empty() ? nullptr : ConstantTensor(graph, q.bias);
      hidden = q.size;
      // The packed weight and bias become the Attention's as they are: their types are checked, their
      // values not read.
      const bool bias_ok = q.bias.empty() || (b != nullptr && b->dims_size() == 1 && b->dims(0) == 3 * hidden &&
                                              b->data_type() == onnx::TensorProto::FLOAT);
      if (k.matmul != q.matmul || v.matmul != q.matmul || k.add != q.add || v.add != q.add || q.offset != 0 ||
          k.offset != hidden ||
          v.offset != 2 * hidden || k.size != hidden || v.size != hidden || q_weight->dims(1) != 3 * hidden ||
          !bias_ok || q_weight->data_type() != onnx::TensorProto::FLOAT) {
        *reason = "the packed Q/K/V projection is not split into three equal float parts in order";
        return false;
      }
    } else {
      hidden = q_weight->dims(1);
      for (int i = 0; i < 3; ++i) {
        const onnx::TensorProto* w = ConstantTensor(graph, projections[i]->weight);
        auto wf = w ? TensorFloats(*w) : std::nullopt;
        auto bf = projections[i]->bias.empty() ? std::optional<std::vector<float>>(std::vector<float>(
                                                      static_cast<size_t>(w ? w->dims(w->dims_size() - 1) : 0), 0.0f))
                                                : ConstantFloats(graph, projections[i]->bias);
        if (!wf || !bf || w->dims_size() != 2 || w->dims(0) != input_hidden || w->dims(1) != hidden ||
            bf->size() != static_cast<size_t>(hidden)) {
          *reason = "projection weights are not float constants of one width";
          return false;
        }
        weights[i] = *std::move(wf);
        biases[i] = *std::move(bf);
      }
    }
    if (out.flattened && out.flat_width != hidden) {
      *reason = "the context is flattened to another width than the attention's";
      return false;
    }
    int64_t num_heads = 0, head_size = 0;
    if (!HeadCounts(graph, shapes, context, layout, q, hidden, &num_heads, &head_size)) {
      *reason = "the number of heads is unknown (set transformer.num_heads in the config)";
      return false;
    }
    for (const Projection* p : projections) {
      if (ShownHeads(graph, shapes, layout, *p->reshape, hidden) != std::make_pair(num_heads, head_size)) {
        *reason = "Q, K and V are not split into the same heads";
        return false;
      }
    }
    // Output projection of the sequence-first form, as a [H, H] float constant.
    std::vector<float> out_weight;
    if (layout == Layout::kSequenceFirst) {
      const onnx::TensorProto* w = ConstantTensor(graph, out.out_weight);
      auto wf = w ? TensorFloats(*w) : std::nullopt;
      auto bf = ConstantFloats(graph, out.out_bias);
      if (!wf || !bf || w->dims_size() != 2 || w->dims(0) != hidden || w->dims(1) != hidden ||
          bf->size() != static_cast<size_t>(hidden)) {
        *reason = "the output projection is not a float constant [H, H]";
        return false;
      }
      out_weight = *std::move(wf);
    }

    std::string raw_mask;
    float mask_filter = -10000.0f;
    bool causal = scores.causal_where != nullptr;
    std::string attention_bias;
    if (scores.mask_add != nullptr) {
      std::string boolean_reason, additive_reason;
      if (!MatchBooleanMask(graph, context, scores.mask_term, &state->probed, &raw_mask, &mask_filter, &causal,
                            &boolean_reason) &&
          !MatchAdditiveMask(graph, shapes, scores.mask_term, &raw_mask, &mask_filter, &additive_reason)) {
        // Any other float term added to the scores (T5's relative position bias plus its mask) is
        // Attention's attention_bias, when it is [B or 1, N or 1, S, T] with the scores' S and T.
        const std::string& term = scores.mask_term;
        const bool biased = boolean_reason.empty() && shapes.ElementType(term) == onnx::TensorProto::FLOAT &&
                            FitsAttentionBias(shapes, term, softmax->input(0), num_heads);
        if (!biased) {
          *reason = !boolean_reason.empty() ? boolean_reason
                                            : absl::StrCat(additive_reason, ", nor a [B|1, N|1, S, T] float bias");
          return false;
        }
        attention_bias = term;
      }
    }

    // Every intermediate is read only inside the pattern, or by shape arithmetic that feeds the
    // pattern's own Reshapes.
    std::vector<Node*> pattern = {softmax, scores.qk, context_matmul};
    pattern.insert(pattern.end(), nan_guard.begin(), nan_guard.end());
    pattern.insert(pattern.end(), out.nodes.begin(), out.nodes.end());
    pattern.insert(pattern.end(), scores.pre_scales.begin(), scores.pre_scales.end());
    for (Node* node : {scores.post_scale, scores.mask_add, scores.causal_where, input_transpose}) {
      if (node != nullptr) pattern.push_back(node);
    }
    std::set<Node*> members;
    for (const Projection* p : projections) {
      for (Node* node : {p->matmul, p->add, p->part, p->reshape}) {
        if (node != nullptr && members.insert(node).second) pattern.push_back(node);
      }
      pattern.insert(pattern.end(), p->transposes.begin(), p->transposes.end());
    }
    members.insert(pattern.begin(), pattern.end());
    std::set<Node*> targets = {q.reshape, k.reshape, v.reshape};
    targets.insert(out.reshapes.begin(), out.reshapes.end());
    // The causal mask's Slices go too when nothing else reads them (layers may share one after CSE).
    if (scores.causal_where != nullptr) {
      for (Node* slice : CausalSlices(graph, scores.causal_where->input(0))) {
        bool only_pattern = !graph.IsGraphOutput(slice->output(0));
        for (Node* reader : graph.Consumers(slice->output(0))) only_pattern &= members.count(reader) > 0;
        if (!only_pattern) break;
        pattern.push_back(slice);
        members.insert(slice);
        targets.insert(slice);
      }
    }
    std::vector<Node*> shape_nodes;
    if (!OnlyReadInside(graph, pattern, members, targets, out.output, &shape_nodes, reason)) return false;

    // Rewrite.
    std::string w_name = q.weight, b_name = q.bias;
    if (packed && q.bias.empty()) {  // Attention takes a bias: zeros
      b_name = graph.UniqueName("attention_qkv_bias");
      graph.AddInitializer(MakeFloatTensor(b_name, {3 * hidden}, std::vector<float>(static_cast<size_t>(3 * hidden), 0.0f)));
    }
    if (!packed) {
      std::vector<float> packed_weight(static_cast<size_t>(input_hidden * 3 * hidden));
      for (int64_t row = 0; row < input_hidden; ++row) {
        for (int i = 0; i < 3; ++i) {
          std::copy(weights[i].begin() + row * hidden, weights[i].begin() + (row + 1) * hidden,
                    packed_weight.begin() + row * 3 * hidden + i * hidden);
        }
      }
      std::vector<float> packed_bias;
      for (int i = 0; i < 3; ++i) packed_bias.insert(packed_bias.end(), biases[i].begin(), biases[i].end());
      w_name = graph.UniqueName("attention_qkv_weight");
      b_name = graph.UniqueName("attention_qkv_bias");
      graph.AddInitializer(MakeFloatTensor(w_name, {input_hidden, 3 * hidden}, packed_weight));
      graph.AddInitializer(MakeFloatTensor(b_name, {3 * hidden}, packed_bias));
    }
    onnx::NodeProto attention;
    attention.set_op_type("Attention");
    attention.set_domain("com.microsoft");
    attention.set_name(graph.UniqueName("Attention"));
    for (const std::string& name : {input, w_name, b_name}) attention.add_input(name);
    if (!raw_mask.empty()) {
      auto known = state->int32_masks.find(raw_mask);
      if (known == state->int32_masks.end()) {
        known = state->int32_masks.emplace(raw_mask, AddCast(graph, raw_mask, onnx::TensorProto::INT32, q.matmul)).first;
      }
      attention.add_input(known->second);
    }
    const std::string attended = layout == Layout::kBatchFirst && !out.flattened
                                     ? out.output
                                     : graph.UniqueName(out.output + "_attention");
    if (!attention_bias.empty()) {
      if (raw_mask.empty()) attention.add_input("");  // mask_index
      attention.add_input("");                       // past
      attention.add_input(attention_bias);           // attention_bias
    }
    attention.add_output(attended);
    *attention.add_attribute() = IntAttribute("num_heads", num_heads);
    if (causal) *attention.add_attribute() = IntAttribute("unidirectional", 1);
    if (!raw_mask.empty()) *attention.add_attribute() = FloatAttribute("mask_filter_value", mask_filter);
    if (std::fabs(scores.scale * std::sqrt(static_cast<float>(head_size)) - 1.0f) > 1e-6f) {
      *attention.add_attribute() = FloatAttribute("scale", scores.scale);
    }
    Node* anchor = out.nodes.back();
    for (Node* node : pattern) graph.RemoveNode(node);
    for (Node* node : shape_nodes) {
      if (!node->removed()) graph.RemoveNode(node);
    }
    Node* fused = graph.AddNode(std::move(attention), anchor, /*after=*/true);
    if (out.flattened) AddFlatten(graph, attended, out.output, hidden, fused);
    if (layout == Layout::kSequenceFirst) {
      // The output projection, row-wise, now on the batch-first result: MatMul(W [H_in, H_out]) + b.
      std::string weight = out.out_weight;
      if (out.out_weight_transposed) {
        std::vector<float> transposed(out_weight.size());
        for (int64_t row = 0; row < hidden; ++row) {
          for (int64_t col = 0; col < hidden; ++col) transposed[col * hidden + row] = out_weight[row * hidden + col];
        }
        weight = graph.UniqueName(out.out_weight + "_transposed");
        graph.AddInitializer(MakeFloatTensor(weight, {hidden, hidden}, transposed));
      }
      onnx::NodeProto matmul;
      matmul.set_op_type("MatMul");
      matmul.set_name(graph.UniqueName("attention_output_projection"));
      const std::string projected = graph.UniqueName(out.output + "_projected");
      matmul.add_input(attended);
      matmul.add_input(weight);
      matmul.add_output(projected);
      Node* added = graph.AddNode(std::move(matmul), fused, /*after=*/true);
      onnx::NodeProto add;
      add.set_op_type("Add");
      add.set_name(graph.UniqueName("attention_output_bias"));
      add.add_input(projected);
      add.add_input(out.out_bias);
      add.add_output(out.output);
      graph.AddNode(std::move(add), added, /*after=*/true);
    }
    context.RequireOpset("com.microsoft", 1);
    context.CountRewrite();
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseAttentionPass() { return std::make_unique<FuseAttentionPass>(); }

}  // namespace onnxopt
