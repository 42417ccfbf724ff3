// canonicalize_head_biases: a constant bias added to a projection after its head split (ESPnet's and
// WeNet's relative-position attention, `q.view(B, T, H, d) + pos_bias_u`; NeMo's; a Q bias of shape
// [1, 1, N, D]) moves before the split, into the projection's own bias where it has one, so the
// attention fusion sees Add(MatMul(x, W), b) -> Reshape, the form it takes.
//
// Before:  h = Add(Reshape(p, [B, S, N, D]), u)            u constant, [N, D] with leading 1s
// After:   h = Reshape(Add(p, flat(u)), [B, S, N, D])
//          and where p = Add(MatMul(x, W), b) with b constant [N*D]:
//          h = Reshape(Add(MatMul(x, W), b + flat(u)), [B, S, N, D])
// Checked: p is float [B, S, N*D] and the Reshape only splits its last axis into the [N, D] u has
// (shapes show B and S kept, N and D known). Each Add of a bias gets its own projection Add and Reshape:
// one head split read with two biases (ESPnet's q + u for the keys, q + v for the positions) becomes
// two. Exact up to the order of two float additions (b + u is summed once, in float).
#include <string>
#include <vector>

#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// The values of a constant [.., N, D] whose leading dims are 1, flattened; nullopt for another shape.
std::optional<std::vector<float>> HeadBias(const onnx::TensorProto& tensor, int64_t heads, int64_t head_size) {
  const int rank = tensor.dims_size();
  if (tensor.data_type() != onnx::TensorProto::FLOAT || rank < 2 || rank > 4 || tensor.dims(rank - 2) != heads ||
      tensor.dims(rank - 1) != head_size) {
    return std::nullopt;
  }
  for (int i = 0; i + 2 < rank; ++i) {
    if (tensor.dims(i) != 1) return std::nullopt;
  }
  return TensorFloats(tensor);
}

// True if `reshape` splits only the last axis of its rank-3 input into (N, D).
bool SplitsLastAxis(const ShapeInfo& shapes, const Node& reshape, int64_t heads, int64_t head_size) {
  const std::string& in = reshape.input(0);
  const std::string& out = reshape.output(0);
  return shapes.Rank(in) == 3 && shapes.Rank(out) == 4 && shapes.SameDim(out, 0, in, 0) &&
         shapes.SameDim(out, 1, in, 1) && shapes.DimValue(in, 2) == heads * head_size &&
         shapes.ElementType(in) == onnx::TensorProto::FLOAT;
}

class CanonicalizeHeadBiasesPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_head_biases"; }
  absl::string_view description() const override {
    return "Move a constant bias added to a projection's split heads (relative-position attention's pos_bias_u) "
           "before the head split, into the projection's bias";
  }

 protected:
  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    std::vector<Node*> split_before;  // head splits the moves may leave unread (and what only they read)
    for (Node* add : graph.Nodes()) {
      if (add->removed() || add->op_type() != "Add" || !add->domain().empty() || add->input_size() != 2) continue;
      for (int side = 0; side < 2; ++side) {
        Node* reshape = ProducerWithOp(graph, add->input(side), "Reshape");
        const onnx::TensorProto* bias = ConstantTensor(graph, add->input(1 - side));
        if (reshape == nullptr || bias == nullptr) continue;
        const auto heads = shapes.DimValue(reshape->output(0), 2);
        const auto head_size = shapes.DimValue(reshape->output(0), 3);
        if (!heads || !head_size || !SplitsLastAxis(shapes, *reshape, *heads, *head_size)) continue;
        std::optional<std::vector<float>> flat = HeadBias(*bias, *heads, *head_size);
        if (!flat) continue;
        split_before.push_back(reshape);
        MoveBeforeSplit(graph, add, *reshape, *std::move(flat));
        context.CountRewrite();
        break;
      }
    }
    RemoveUnreadNodes(graph, std::move(split_before));
    return absl::OkStatus();
  }

 private:
  // Replaces `add` (heads + bias) by Reshape(projection + bias) written to its output.
  static void MoveBeforeSplit(Graph& graph, Node* add, const Node& reshape, std::vector<float> flat) {
    std::string projected = reshape.input(0);
    // Add(MatMul(x, W), b) with a constant b as wide: one Add of b + u on the MatMul.
    if (Node* projection = ProducerWithOp(graph, projected, "Add"); projection != nullptr) {
      for (int side = 0; side < 2; ++side) {
        const std::optional<std::vector<float>> b = ConstantFloats(graph, projection->input(1 - side));
        const onnx::TensorProto* b_tensor = ConstantTensor(graph, projection->input(1 - side));
        if (ProducerWithOp(graph, projection->input(side), "MatMul") == nullptr || !b || b->size() != flat.size() ||
            b_tensor->dims_size() != 1) {
          continue;
        }
        for (size_t i = 0; i < flat.size(); ++i) flat[i] += (*b)[i];
        projected = projection->input(side);
        break;
      }
    }
    const std::string output = add->output(0);
    const std::string name = add->name().empty() ? "head_bias" : add->name();
    const std::string shape = reshape.input(1);
    const std::string bias = graph.UniqueName(name + "_before_split");
    graph.AddInitializer(MakeFloatTensor(bias, {static_cast<int64_t>(flat.size())}, flat));
    NodeChain chain(graph, add);
    const std::string biased = chain.Add("Add", {projected, bias}, name + "_projection");
    onnx::NodeProto split = MakeNode("Reshape", graph.UniqueName(name + "_heads"), {biased, shape}, {output});
    for (const auto& attribute : reshape.proto().attribute()) *split.add_attribute() = attribute;
    graph.RemoveNode(add);
    chain.AddNode(std::move(split));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeHeadBiasesPass() { return std::make_unique<CanonicalizeHeadBiasesPass>(); }

}  // namespace onnxopt
