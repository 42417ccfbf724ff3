// fuse_attention: self-attention, as PyTorch exports Hugging Face style modules (BERT-style encoders
// and GPT-2 style decoders without past state), becomes ONNX Runtime's com.microsoft::Attention.
//
// Before:  q = Add(MatMul(x, Wq), bq) -> Reshape [B,S,N,D] -> Transpose(0,2,1,3)
//          k = Add(MatMul(x, Wk), bk) -> Reshape -> Transpose(0,2,3,1)   (or (0,2,1,3) then (0,1,3,2))
//          v = Add(MatMul(x, Wv), bv) -> Reshape -> Transpose(0,2,1,3)
//          p = Softmax(Add(Div(MatMul(q, k), sqrt(D)) | Mul(.., 1/sqrt(D)), mask_term), axis=-1)
//          y = Reshape(Transpose(MatMul(p, v), (0,2,1,3)), [B,S,N*D])
//          mask_term = Mul(Sub(1, Cast(Unsqueeze(mask[B,S], axes=[1,2]))), c)   (c = -10000 or finfo.min)
// After:   y = Attention(x, [Wq|Wk|Wv], [bq|bk|bv], Cast(mask, int32), num_heads=N,
//                        mask_filter_value=c, scale=the graph's own scale)
// GPT-2:   Q/K/V are outputs 0/1/2 of Split(Add(MatMul(x, W[H,3H]), b[3H])), and the scores go through
//          Where(bias[:, :, :S, :S], scores, c <= -1e4) with `bias` a lower-triangular buffer
//          -> Attention(x, W, b, unidirectional=1)
// Checked: one x, constant float weights [H,H] and biases [H], N and D from the Reshape's inferred
// shape with N*D = H, the exact perms, Softmax on the last axis, the mask in the (1 - mask) * c form
// of a [B,S] mask (Attention's raw mask reads 0 as masked: masks must hold 0/1, as attention masks
// do), and no reader outside the pattern but the shape arithmetic (Shape -> Gather -> Unsqueeze ->
// Concat) feeding its own Reshapes, which goes with it.
#include <cmath>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

std::vector<int64_t> Perm(const Node* node) {
  const onnx::AttributeProto* perm = node == nullptr ? nullptr : node->FindAttribute("perm");
  return perm == nullptr ? std::vector<int64_t>() : std::vector<int64_t>(perm->ints().begin(), perm->ints().end());
}

// One projection: Add(MatMul(x, W), b) -> Reshape -> (Transpose chain). Returns false if it is not.
struct Projection {
  Node* matmul = nullptr;
  Node* add = nullptr;
  Node* reshape = nullptr;
  Node* split = nullptr;  // packed Q/K/V (GPT-2's c_attn): output `split_index` of one Split
  int split_index = -1;
  std::vector<Node*> transposes;
  std::string x, weight, bias;
};

bool MatchProjection(const Graph& graph, const std::string& head_value, const std::vector<std::vector<int64_t>>& perms,
                     Projection* projection) {
  std::string value = head_value;
  for (auto it = perms.rbegin(); it != perms.rend(); ++it) {
    Node* transpose = ProducerWithOp(graph, value, "Transpose");
    if (transpose == nullptr || Perm(transpose) != *it) return false;
    projection->transposes.push_back(transpose);
    value = transpose->input(0);
  }
  projection->reshape = ProducerWithOp(graph, value, "Reshape");
  if (projection->reshape == nullptr) return false;
  std::string projected = projection->reshape->input(0);
  if (Node* split = ProducerWithOp(graph, projected, "Split")) {
    projection->split = split;
    for (int i = 0; i < split->output_size(); ++i) {
      if (split->output(i) == projected) projection->split_index = i;
    }
    projected = split->input(0);
  }
  projection->add = ProducerWithOp(graph, projected, "Add");
  if (projection->add == nullptr) return false;
  for (int side = 0; side < 2; ++side) {
    Node* matmul = ProducerWithOp(graph, projection->add->input(side), "MatMul");
    if (matmul == nullptr) continue;
    projection->matmul = matmul;
    projection->bias = projection->add->input(1 - side);
    projection->x = matmul->input(0);
    projection->weight = matmul->input(1);
    return true;
  }
  return false;
}

// True if `cond` is a lower-triangular (causal) buffer [1,1,P,P] sliced from 0 on its last two axes,
// as GPT-2 style models write `bias[:, :, :seq, :seq]`.
bool IsCausalSlice(const Graph& graph, const std::string& cond) {
  std::string value = cond;
  std::set<int64_t> sliced_axes;
  for (int depth = 0; depth < 3; ++depth) {
    Node* slice = ProducerWithOp(graph, value, "Slice");
    if (slice == nullptr) break;
    if (slice->input_size() < 4) return false;
    auto starts = ConstantInts(graph, slice->input(1));
    auto axes = ConstantInts(graph, slice->input(3));
    auto steps = slice->input_size() > 4 && !slice->input(4).empty() ? ConstantInts(graph, slice->input(4))
                                                                      : std::optional<std::vector<int64_t>>(std::vector<int64_t>{1});
    if (!starts || !axes || !steps || starts->size() != axes->size()) return false;
    for (size_t i = 0; i < axes->size(); ++i) {
      const int64_t axis = (*axes)[i] < 0 ? (*axes)[i] + 4 : (*axes)[i];
      const int64_t step = steps->size() == 1 ? (*steps)[0] : (i < steps->size() ? (*steps)[i] : 0);
      if ((*starts)[i] != 0 || step != 1 || (axis != 2 && axis != 3)) return false;
      sliced_axes.insert(axis);
    }
    value = slice->input(0);
  }
  const onnx::TensorProto* buffer = ConstantTensor(graph, value);
  if (buffer == nullptr || buffer->dims_size() != 4 || buffer->dims(0) != 1 || buffer->dims(1) != 1 ||
      buffer->dims(2) != buffer->dims(3) || sliced_axes != std::set<int64_t>{2, 3}) {
    return false;
  }
  const int64_t n = buffer->dims(2);
  std::vector<bool> on;
  if (buffer->data_type() == onnx::TensorProto::BOOL || buffer->data_type() == onnx::TensorProto::UINT8) {
    if (buffer->has_raw_data()) {
      for (char c : buffer->raw_data()) on.push_back(c != 0);
    } else {
      for (int32_t v : buffer->int32_data()) on.push_back(v != 0);
    }
  } else if (auto floats = TensorFloats(*buffer)) {
    for (float v : *floats) on.push_back(v != 0);
  }
  if (static_cast<int64_t>(on.size()) != n * n) return false;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (on[static_cast<size_t>(i * n + j)] != (j <= i)) return false;
    }
  }
  return true;
}

class FuseAttentionPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_attention"; }
  absl::string_view description() const override {
    return "Fuse encoder self-attention (Q/K/V projections, scaled masked softmax) into ONNX Runtime's Attention";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    std::unordered_map<std::string, std::string> int32_masks;  // raw mask -> its int32 Cast
    for (Node* softmax : graph.Nodes()) {
      if (softmax->removed() || softmax->op_type() != "Softmax" || !softmax->domain().empty()) continue;
      std::string reason;
      if (!TryFuse(graph, softmax, *shapes, context, &int32_masks, &reason) && !reason.empty()) {
        context.Skip(absl::StrCat("fuse_attention: ", reason));
      }
    }
    return absl::OkStatus();
  }

 private:
  static bool TryFuse(Graph& graph, Node* softmax, const ShapeInfo& shapes, PassContext& context,
                      std::unordered_map<std::string, std::string>* int32_masks, std::string* reason) {
    const auto rank = shapes.Rank(softmax->input(0));
    const int64_t axis = softmax->GetAttributeInt("axis", -1);
    if (!rank || *rank != 4 || (axis != -1 && axis != 3)) return false;
    // Scores, optionally masked: causally (Where over a tril buffer) and/or additively.
    std::string scaled = softmax->input(0);
    Node* causal_where = nullptr;
    if (Node* where = ProducerWithOp(graph, scaled, "Where")) {
      auto fill = ConstantScalarFloat(graph, where->input(2));
      if (!IsCausalSlice(graph, where->input(0)) || !fill || *fill > -1e4f) {
        *reason = "Where before Softmax is not a causal mask";
        return false;
      }
      causal_where = where;
      scaled = where->input(1);
    }
    Node* mask_add = nullptr;
    std::string mask_term;
    if (Node* add = ProducerWithOp(graph, scaled, "Add")) {
      for (int side = 0; side < 2; ++side) {
        Node* candidate = graph.Producer(add->input(side));
        if (candidate != nullptr && (candidate->op_type() == "Div" || candidate->op_type() == "Mul" ||
                                     candidate->op_type() == "MatMul")) {
          mask_add = add;
          scaled = add->input(side);
          mask_term = add->input(1 - side);
          break;
        }
      }
      if (mask_add == nullptr) return false;
    }
    Node* scale_node = graph.Producer(scaled);
    Node* qk = nullptr;
    float scale = 1.0f;
    if (scale_node != nullptr && scale_node->domain().empty() &&
        (scale_node->op_type() == "Div" || scale_node->op_type() == "Mul")) {
      auto constant = ConstantScalarFloat(graph, scale_node->input(1));
      qk = ProducerWithOp(graph, scale_node->input(0), "MatMul");
      if (!constant || qk == nullptr || *constant == 0) return false;
      scale = scale_node->op_type() == "Div" ? 1.0f / *constant : *constant;
    } else {
      qk = ProducerWithOp(graph, scaled, "MatMul");
      scale_node = nullptr;
      if (qk == nullptr) return false;
    }
    // Context: MatMul(probs, v) -> Transpose(0,2,1,3) -> Reshape [B,S,H].
    auto probs_readers = graph.Consumers(softmax->output(0));
    if (probs_readers.size() != 1 || probs_readers[0]->op_type() != "MatMul" || probs_readers[0]->input(0) != softmax->output(0)) {
      return false;
    }
    Node* context_matmul = probs_readers[0];
    auto ctx_readers = graph.Consumers(context_matmul->output(0));
    Node* ctx_transpose = ctx_readers.size() == 1 ? ctx_readers[0] : nullptr;
    if (ctx_transpose == nullptr || ctx_transpose->op_type() != "Transpose" ||
        Perm(ctx_transpose) != std::vector<int64_t>{0, 2, 1, 3}) {
      return false;
    }
    Node* out_reshape = nullptr;
    for (Node* reader : graph.Consumers(ctx_transpose->output(0))) {
      if (reader->op_type() == "Reshape" && reader->input(0) == ctx_transpose->output(0)) out_reshape = reader;
    }
    if (out_reshape == nullptr || shapes.Rank(out_reshape->output(0)).value_or(0) != 3) {
      *reason = "the context is not reshaped back to [B,S,H]";
      return false;
    }
    Projection q, k, v;
    if (!MatchProjection(graph, qk->input(0), {{0, 2, 1, 3}}, &q) ||
        !MatchProjection(graph, context_matmul->input(1), {{0, 2, 1, 3}}, &v)) {
      return false;
    }
    if (!MatchProjection(graph, qk->input(1), {{0, 2, 3, 1}}, &k)) {
      k = Projection();
      if (!MatchProjection(graph, qk->input(1), {{0, 2, 1, 3}, {0, 1, 3, 2}}, &k)) return false;
    }
    if (q.x != k.x || q.x != v.x) {
      *reason = "Q, K and V are not projections of one input";
      return false;
    }
    // Heads and sizes.
    auto head_shape = shapes.TypeOf(q.reshape->output(0));
    auto x_shape = shapes.StaticShape(q.x);
    const auto x_rank = shapes.Rank(q.x);
    if (head_shape == nullptr || head_shape->tensor_type().shape().dim_size() != 4 || !x_rank || *x_rank != 3) {
      *reason = "head shapes are unknown";
      return false;
    }
    const auto& dims = head_shape->tensor_type().shape().dim();
    if (!dims[2].has_dim_value() || !dims[3].has_dim_value()) {
      *reason = "the number of heads is unknown";
      return false;
    }
    const int64_t num_heads = dims[2].dim_value(), head_size = dims[3].dim_value();
    const int64_t hidden = num_heads * head_size;
    std::vector<float> weights[3], biases[3];
    const Projection* projections[3] = {&q, &k, &v};
    const bool packed_qkv = q.split != nullptr;
    if (packed_qkv) {
      // One projection split three ways: its weight [H_in, 3H] and bias [3H] are already in Q|K|V order.
      auto split_sizes = q.split->input_size() > 1 ? ConstantInts(graph, q.split->input(1)) : std::nullopt;
      const int64_t split_axis = q.split->GetAttributeInt("axis", 0);
      const onnx::TensorProto* w = ConstantTensor(graph, q.weight);
      const onnx::TensorProto* b = ConstantTensor(graph, q.bias);
      if (k.split != q.split || v.split != q.split || q.split_index != 0 || k.split_index != 1 ||
          v.split_index != 2 || q.split->output_size() != 3 || (split_axis != 2 && split_axis != -1) ||
          !split_sizes || *split_sizes != std::vector<int64_t>{hidden, hidden, hidden} || w == nullptr ||
          b == nullptr || w->dims_size() != 2 || w->dims(1) != 3 * hidden || b->dims_size() != 1 ||
          b->dims(0) != 3 * hidden || !TensorFloats(*w) || !TensorFloats(*b)) {
        *reason = "packed Q/K/V projection is not split into three equal float parts";
        return false;
      }
    }
    for (int i = 0; i < 3 && !packed_qkv; ++i) {
      const onnx::TensorProto* w = ConstantTensor(graph, projections[i]->weight);
      auto wf = w ? TensorFloats(*w) : std::nullopt;
      auto bf = ConstantFloats(graph, projections[i]->bias);
      if (!wf || !bf || w->dims_size() != 2 || w->dims(1) != hidden || bf->size() != static_cast<size_t>(hidden)) {
        *reason = "projection weights are not float constants of the attention's width";
        return false;
      }
      weights[i] = *std::move(wf);
      biases[i] = *std::move(bf);
      if (i > 0 && w->dims(0) != ConstantTensor(graph, q.weight)->dims(0)) return false;
    }

    (void)x_shape;
    // The mask: (1 - Cast(Unsqueeze(mask, [1,2]))) * c, or none.
    std::string raw_mask;
    float mask_filter = -10000.0f;
    std::vector<Node*> mask_nodes;  // only removed if nothing else reads them
    if (mask_add != nullptr) {
      Node* mul = ProducerWithOp(graph, mask_term, "Mul");
      if (mul == nullptr) {
        *reason = "the mask is not in the (1 - mask) * c form";
        return false;
      }
      Node* sub = nullptr;
      for (int side = 0; side < 2 && sub == nullptr; ++side) {
        auto c = ConstantScalarFloat(graph, mul->input(1 - side));
        Node* candidate = ProducerWithOp(graph, mul->input(side), "Sub");
        if (c && candidate != nullptr) {
          sub = candidate;
          mask_filter = *c;
        }
      }
      auto one = sub ? ConstantScalarFloat(graph, sub->input(0)) : std::nullopt;
      if (sub == nullptr || !one || *one != 1.0f) {
        *reason = "the mask is not in the (1 - mask) * c form";
        return false;
      }
      std::string value = sub->input(1);
      if (Node* cast = ProducerWithOp(graph, value, "Cast")) value = cast->input(0);
      Node* unsqueeze = ProducerWithOp(graph, value, "Unsqueeze");
      std::optional<std::vector<int64_t>> axes;
      if (unsqueeze != nullptr) {
        axes = unsqueeze->input_size() > 1 ? ConstantInts(graph, unsqueeze->input(1)) : std::nullopt;
        if (!axes) {
          const onnx::AttributeProto* attribute = unsqueeze->FindAttribute("axes");
          if (attribute != nullptr) axes = std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
        }
      }
      if (unsqueeze == nullptr || !axes || *axes != std::vector<int64_t>{1, 2} ||
          shapes.Rank(unsqueeze->input(0)).value_or(0) != 2) {
        *reason = "the mask is not a [B,S] mask unsqueezed to [B,1,1,S]";
        return false;
      }
      raw_mask = unsqueeze->input(0);
    }
    // Every intermediate is read only inside the pattern, or by shape arithmetic that feeds the
    // pattern's own Reshapes.
    std::vector<Node*> pattern = {softmax, qk, context_matmul, ctx_transpose, out_reshape};
    if (scale_node != nullptr) pattern.push_back(scale_node);
    if (mask_add != nullptr) pattern.push_back(mask_add);
    if (causal_where != nullptr) pattern.push_back(causal_where);
    for (const Projection* p : projections) {
      if (!packed_qkv || p == &q) pattern.insert(pattern.end(), {p->matmul, p->add});
      pattern.push_back(p->reshape);
      pattern.insert(pattern.end(), p->transposes.begin(), p->transposes.end());
    }
    if (packed_qkv) pattern.push_back(q.split);
    const std::set<Node*> members(pattern.begin(), pattern.end());
    const std::set<Node*> reshapes = {q.reshape, k.reshape, v.reshape, out_reshape};
    std::vector<Node*> shape_nodes;
    for (Node* node : pattern) {
      if (node == out_reshape) continue;
      if (graph.IsGraphOutput(node->output(0))) return false;
      for (Node* reader : graph.Consumers(node->output(0))) {
        if (members.count(reader) > 0) continue;
        if (!FeedsOnlyReshapeTargets(graph, reader, reshapes, &shape_nodes)) {
          *reason = "an intermediate value is read outside the pattern";
          return false;
        }
      }
    }
    // Rewrite.
    const int64_t input_hidden = ConstantTensor(graph, q.weight)->dims(0);
    std::string w_name = q.weight, b_name = q.bias;
    if (!packed_qkv) {
    std::vector<float> packed(static_cast<size_t>(input_hidden * 3 * hidden));
    for (int64_t row = 0; row < input_hidden; ++row) {
      for (int i = 0; i < 3; ++i) {
        std::copy(weights[i].begin() + row * hidden, weights[i].begin() + (row + 1) * hidden,
                  packed.begin() + row * 3 * hidden + i * hidden);
      }
    }
    std::vector<float> packed_bias;
    for (int i = 0; i < 3; ++i) packed_bias.insert(packed_bias.end(), biases[i].begin(), biases[i].end());
    w_name = graph.UniqueName("attention_qkv_weight");
    b_name = graph.UniqueName("attention_qkv_bias");
    graph.AddInitializer(MakeFloatTensor(w_name, {input_hidden, 3 * hidden}, packed));
    graph.AddInitializer(MakeFloatTensor(b_name, {3 * hidden}, packed_bias));
    }
    onnx::NodeProto attention;
    attention.set_op_type("Attention");
    attention.set_domain("com.microsoft");
    attention.set_name(graph.UniqueName("Attention"));
    attention.add_input(q.x);
    attention.add_input(w_name);
    attention.add_input(b_name);
    if (!raw_mask.empty()) {
      auto known = int32_masks->find(raw_mask);
      if (known == int32_masks->end()) {
        onnx::NodeProto cast;
        cast.set_op_type("Cast");
        const std::string cast_name = graph.UniqueName(raw_mask + "_int32");
        cast.set_name(cast_name);
        cast.add_input(raw_mask);
        cast.add_output(cast_name);
        auto* to = cast.add_attribute();
        to->set_name("to");
        to->set_type(onnx::AttributeProto::INT);
        to->set_i(onnx::TensorProto::INT32);
        graph.AddNode(std::move(cast), q.matmul, /*after=*/false);
        known = int32_masks->emplace(raw_mask, cast_name).first;
      }
      attention.add_input(known->second);
    }
    attention.add_output(out_reshape->output(0));
    auto add_attribute = [&](const char* name, auto value) {
      auto* attribute = attention.add_attribute();
      attribute->set_name(name);
      if constexpr (std::is_same_v<decltype(value), float>) {
        attribute->set_type(onnx::AttributeProto::FLOAT);
        attribute->set_f(value);
      } else {
        attribute->set_type(onnx::AttributeProto::INT);
        attribute->set_i(value);
      }
    };
    add_attribute("num_heads", num_heads);
    if (causal_where != nullptr) add_attribute("unidirectional", int64_t{1});
    if (!raw_mask.empty()) add_attribute("mask_filter_value", mask_filter);
    if (std::fabs(scale * std::sqrt(static_cast<float>(head_size)) - 1.0f) > 1e-6f) add_attribute("scale", scale);
    for (Node* node : pattern) graph.RemoveNode(node);
    for (Node* node : shape_nodes) {
      if (!node->removed()) graph.RemoveNode(node);
    }
    graph.AddNode(std::move(attention), out_reshape, /*after=*/true);
    context.RequireOpset("com.microsoft", 1);
    context.CountRewrite();
    return true;
  }

  // True if `node` is shape arithmetic whose results reach only the given Reshapes' shape inputs;
  // collects the nodes on the way.
  static bool FeedsOnlyReshapeTargets(const Graph& graph, Node* node, const std::set<Node*>& reshapes,
                                      std::vector<Node*>* collected, int depth = 0) {
    static const std::set<std::string> kShapeOps = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "Slice"};
    if (depth > 8 || !node->domain().empty() || kShapeOps.count(node->op_type()) == 0) return false;
    if (graph.IsGraphOutput(node->output(0))) return false;
    for (Node* reader : graph.Consumers(node->output(0))) {
      if (reshapes.count(reader) > 0 && reader->input(1) == node->output(0)) continue;
      if (!FeedsOnlyReshapeTargets(graph, reader, reshapes, collected, depth + 1)) return false;
    }
    collected->push_back(node);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseAttentionPass() { return std::make_unique<FuseAttentionPass>(); }

}  // namespace onnxopt
