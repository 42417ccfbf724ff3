// canonicalize_flat_heads: older transformers' encoder-decoders (BART, mBART, Marian, Pegasus, Whisper,
// Speech2Text: `view(bsz * num_heads, -1, head_dim)` and torch.bmm) compute attention on heads flattened
// into the batch, [B*N, S, D]. The same products on the 4-D heads [B, N, S, D] are the form the attention
// fusion reads.
//
// Before:  q3 = Reshape(Transpose(Reshape(q, [B,S,N,D]), [0,2,1,3]), [B*N, S, D])     (K, V alike)
//          p = Softmax(MatMul(q3, Transpose(k3, [0,2,1])), axis=2)
//          [scores = Reshape(Add(Reshape(scores, [B,N,S,T]), mask), [B*N,S,T])]       (a decoder's mask)
//          context = Transpose(Reshape(MatMul(p, v3), [B,N,S,D]), [0,2,1,3])
// After:   p = Softmax(MatMul(q4, Transpose(k4, [0,1,3,2])), axis=-1), [Add(scores, mask)],
//          context = Transpose(MatMul(p, v4), [0,2,1,3])       (q4 = Transpose(Reshape(q, ...)), k4, v4 alike)
// Checked: a flattening Reshape keeps the last two axes of its 4-D input (the first is then B*N) and an
// unflattening one gives back the same [B, N] (shape inference shows the dims equal, as numbers or names);
// between them only Transposes of the last two axes, MatMuls of two flattened values, scalar Mul/Div,
// Softmax over the last axis, Cast, Identity and Dropout. Nodes that read a flattened value otherwise keep
// reading it (the 3-D chain stays for them); what the rewrite leaves unread is removed.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// Whether `to` keeps `from`'s dims `from_axes` at its `to_axes` (same numbers or names).
bool SameDims(const ShapeInfo& shapes, const std::string& from, std::vector<int> from_axes, const std::string& to,
              std::vector<int> to_axes) {
  for (size_t i = 0; i < from_axes.size(); ++i) {
    if (!shapes.SameDim(from, from_axes[i], to, to_axes[i])) return false;
  }
  return true;
}

// A dim of a known value, by reference.
struct DimRef {
  std::string value;
  int axis = 0;
};

// A flattened value computed on the heads: `value` is 4-D, its leading [B, N] those of `origin`, its
// last two dims those `rows` and `cols` name. The references are values shape inference knows: the
// twins this pass adds are not in `shapes`.
struct Lifted {
  std::string value;
  std::string origin;
  DimRef rows, cols;
};

// The input of the Concat `value` that holds its element `index`, and the element's index there; the
// value itself where it is no Concat (or its parts' lengths are not known).
std::pair<std::string, size_t> ElementSource(const Graph& graph, const ShapeInfo& shapes, const std::string& value,
                                             size_t index) {
  const Node* concat = ProducerWithOp(graph, value, "Concat");
  if (concat == nullptr) return {value, index};
  size_t offset = index;
  for (const std::string& part : concat->proto().input()) {
    std::optional<size_t> size = ShapeValueSize(graph, shapes, part);
    if (!size) {
      std::optional<std::vector<int64_t>> shape = shapes.StaticShape(part);
      if (!shape || shape->size() != 1) return {value, index};
      size = static_cast<size_t>((*shape)[0]);
    }
    if (offset < *size) return {part, offset};
    offset -= *size;
  }
  return {value, index};
}

// Whether element `index` of the shape tensor `target` is dim `dim` of `shaped`.
bool ElementIs(const Graph& graph, const ShapeInfo& shapes, const std::string& target, size_t index,
               const std::string& shaped, int dim) {
  const auto [part, offset] = ElementSource(graph, shapes, target, index);
  return ElementIsDim(graph, shapes, part, offset, shaped, dim);
}

// Whether element `index` of the shape tensor `target` is the product of dims 0 and 1 of `shaped`:
// as numbers, or as the export computes it, Mul(dim 0, dim 1) (made 1-D by Unsqueeze).
bool ElementIsLeadingProduct(const Graph& graph, const ShapeInfo& shapes, const std::string& target, size_t index,
                             const std::string& shaped) {
  const std::optional<int64_t> b = shapes.DimValue(shaped, 0), n = shapes.DimValue(shaped, 1);
  if (b && n && ShapeValueElement(graph, shapes, target, index) == *b * *n) return true;
  const auto [part, offset] = ElementSource(graph, shapes, target, index);
  if (offset != 0) return false;
  for (const Node* producer = graph.Producer(part); producer != nullptr; producer = graph.Producer(producer->input(0))) {
    const absl::string_view op = producer->op_type();
    if (!producer->domain().empty() || producer->input_size() < 1) return false;
    if (op == "Mul" && producer->input_size() == 2) {
      auto is = [&](int i, int dim) { return ElementIsDim(graph, shapes, producer->input(i), 0, shaped, dim); };
      return (is(0, 0) && is(1, 1)) || (is(0, 1) && is(1, 0));
    }
    if (op != "Unsqueeze" && op != "Squeeze" && op != "Reshape" && op != "Cast") return false;
  }
  return false;
}

// A Reshape of [B, N, S, D] to [B*N, S, D]: its first dim B*N, and S or D kept (the other follows).
bool FlattensHeads(const Graph& graph, const ShapeInfo& shapes, const Node& reshape) {
  const std::string &in = reshape.input(0), &out = reshape.output(0), &target = reshape.input(1);
  if (shapes.Rank(in) != 4 || shapes.Rank(out) != 3) return false;
  if (shapes.SameDim(in, 2, out, 1) && shapes.SameDim(in, 3, out, 2)) return true;  // B*N follows
  return ElementIsLeadingProduct(graph, shapes, target, 0, in) &&
         (shapes.SameDim(in, 2, out, 1) || shapes.SameDim(in, 3, out, 2) || ElementIs(graph, shapes, target, 1, in, 2) ||
          ElementIs(graph, shapes, target, 2, in, 3));
}

// A Reshape of the flattened `lifted` back to 4-D heads: [B, N] those of its origin, and its rows or
// columns kept (the other follows).
bool UnflattensHeads(const ShapeInfo& shapes, const Node& reshape, const Lifted& lifted) {
  const std::string& out = reshape.output(0);
  return shapes.Rank(reshape.input(0)) == 3 && shapes.Rank(out) == 4 &&
         SameDims(shapes, lifted.origin, {0, 1}, out, {0, 1}) &&
         (shapes.SameDim(lifted.rows.value, lifted.rows.axis, out, 2) ||
          shapes.SameDim(lifted.cols.value, lifted.cols.axis, out, 3));
}

class CanonicalizeFlatHeadsPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_flat_heads"; }
  absl::string_view description() const override {
    return "Compute attention flattened into [B*N, S, D] (older transformers' bmm) on the [B, N, S, D] heads";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    absl::flat_hash_map<std::string, Lifted> heads;  // a flattened value -> the same on 4-D heads
    std::vector<Node*> touched;                       // nodes the rewrite may leave unread
    for (Node* node : graph.Nodes()) {
      if (node->removed() || !node->domain().empty() || node->output_size() < 1) continue;
      const absl::string_view op = node->op_type();
      auto lifted = [&](int i) -> const Lifted* {
        auto it = i < node->input_size() ? heads.find(node->input(i)) : heads.end();
        return it == heads.end() ? nullptr : &it->second;
      };
      if (op == "Reshape" && lifted(0) == nullptr) {
        if (FlattensHeads(graph, shapes, *node)) {
          const std::string& in = node->input(0);
          heads[node->output(0)] = Lifted{in, in, DimRef{in, 2}, DimRef{in, 3}};
        }
        continue;
      }
      if (lifted(0) == nullptr && lifted(1) == nullptr) continue;
      if (op == "Reshape") {
        if (!UnflattensHeads(shapes, *node, *lifted(0)) || graph.IsGraphOutput(node->output(0))) continue;
        graph.ReplaceAllUsesWith(node->output(0), lifted(0)->value);
        touched.push_back(node);
        context.CountRewrite();
        continue;
      }
      if (node->output_size() > 1 && graph.HasConsumers(node->output(1))) continue;  // Dropout's mask is read
      std::optional<onnx::NodeProto> twin = Twin(graph, shapes, *node, lifted(0), lifted(1), context);
      if (!twin) continue;
      Lifted result = *lifted(0);  // a MatMul has both; any other node its first
      if (op == "MatMul") result.cols = lifted(1)->cols;
      if (op == "Transpose") std::swap(result.rows, result.cols);
      const std::string output = graph.UniqueName(node->output(0) + "_heads");
      twin->set_output(0, output);
      for (int i = 1; i < twin->output_size(); ++i) twin->set_output(i, "");
      touched.push_back(graph.AddNode(*std::move(twin), node, /*after=*/true));
      touched.push_back(node);
      result.value = output;
      heads[node->output(0)] = std::move(result);
    }
    // The 3-D chains the rewiring left unread go, and so do twins that led nowhere (with no rewiring:
    // every twin, and the graph is as it was).
    RemoveUnreadNodes(graph, std::move(touched));
    return absl::OkStatus();
  }

 private:
  // The node on 4-D heads, or nullopt where it is not one of the operators that carry over.
  static std::optional<onnx::NodeProto> Twin(const Graph& graph, const ShapeInfo& shapes, const Node& node,
                                             const Lifted* a, const Lifted* b, PassContext& context) {
    const absl::string_view op = node.op_type();
    onnx::NodeProto twin = node.proto();
    twin.set_name(node.name().empty() ? "" : node.name() + "_heads");
    if (op == "MatMul") {
      // Both flattened the same way: the 3-D product pairs equal flat indices, the 4-D one equal [b, n].
      if (a == nullptr || b == nullptr || !SameDims(shapes, a->origin, {0, 1}, b->origin, {0, 1})) {
        return std::nullopt;
      }
      twin.set_input(0, a->value);
      twin.set_input(1, b->value);
      return twin;
    }
    if (a == nullptr) return std::nullopt;
    twin.set_input(0, a->value);
    if (op == "Transpose") {
      if (PermOf(&node) != std::vector<int64_t>{0, 2, 1}) return std::nullopt;
      twin.clear_attribute();
      *twin.add_attribute() = MakeIntsAttribute("perm", {0, 1, 3, 2});
      return twin;
    }
    if (op == "Mul" || op == "Div") {
      if (!ScalarScale(graph, &node) || b != nullptr) return std::nullopt;
      return twin;
    }
    if (op == "Softmax") {
      const int64_t axis = node.GetAttributeInt("axis", context.OpsetVersion("") >= 13 ? -1 : 1);
      if (axis != 2 && axis != -1) return std::nullopt;  // the last axis of [B*N, S, T]
      twin.clear_attribute();
      *twin.add_attribute() = MakeIntAttribute("axis", 3);
      return twin;
    }
    if (op == "Cast" || op == "Identity" || (op == "Dropout" && node.input_size() == 1)) return twin;
    return std::nullopt;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeFlatHeadsPass() { return std::make_unique<CanonicalizeFlatHeadsPass>(); }

}  // namespace onnxopt
