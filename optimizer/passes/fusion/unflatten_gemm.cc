// unflatten_gemm: a Gemm between a flattening and an unflattening Reshape (how GPT-2's Conv1D and
// other addmm-based projections export) becomes MatMul + Add on the original tensor, the form the
// attention, bias-Gelu and SkipLayerNormalization fusions read.
//
// Before:  f = Reshape(x[..., K], [-1, K]); g = Gemm(f, W[K,N] (or [N,K] with transB), b[N]);
//          y = Reshape(g, <x's leading dims> + [N])
// After:   y = Add(MatMul(x, W[K,N]), b)
// The same with g = MatMul(f, W[K,N]) (Keras' Dense on a 3-D input as keras2onnx and tf2onnx write it,
// its bias added after the second Reshape): y = MatMul(x, W).
// Checked: x has rank >= 3 with a static last dim K, the flattening target is the constant [-1, K],
// Gemm has alpha = beta = 1 and no transA, W and b are float constants, g is read only by the second
// Reshape, and shape inference proves y's leading dims are x's.
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// One Gemm between the Reshapes, as the rewrite needs it.
struct UnflattenMatch {
  Node* flatten = nullptr;
  Node* gemm = nullptr;
  Node* unflatten = nullptr;
  int64_t k = 0, n = 0;
  std::string bias;                    // empty: none
  std::optional<std::vector<float>> transposed_weight_values;  // transB: W [N, K] as read
};

// Anchored at the Gemm.
MatchResult<UnflattenMatch> MatchUnflatten(const Graph& graph, Node* gemm, const ShapeInfo& shapes) {
  const bool matmul = gemm->op_type() == "MatMul" && gemm->input_size() == 2;
  if ((gemm->op_type() != "Gemm" && !matmul) || !gemm->domain().empty() || gemm->output_size() != 1) return Fail();
  UnflattenMatch match;
  match.gemm = gemm;
  match.flatten = ProducerWithOp(graph, gemm->input(0), "Reshape");
  match.unflatten = SoleConsumer(graph, gemm->output(0));
  if (match.flatten == nullptr || match.unflatten == nullptr || match.unflatten->op_type() != "Reshape" ||
      match.unflatten->input(0) != gemm->output(0)) {
    return Fail();
  }
  const std::string& x = match.flatten->input(0);
  const auto rank = shapes.Rank(x);
  const auto k = shapes.DimValue(x, -1);
  const auto target = ConstantInts(graph, match.flatten->input(1));
  if (!rank || *rank < 3 || !k || !target || *target != std::vector<int64_t>{-1, *k}) {
    return matmul ? Fail() : Fail("unflatten_gemm: the Gemm input is not x flattened to [-1, K]");
  }
  match.k = *k;
  if (gemm->GetAttributeInt("transA", 0) != 0 || gemm->GetAttributeFloat("alpha", 1.0f) != 1.0f ||
      gemm->GetAttributeFloat("beta", 1.0f) != 1.0f) {
    return Fail("unflatten_gemm: Gemm scales or transposes its input");
  }
  const bool trans_b = gemm->GetAttributeInt("transB", 0) != 0;
  const onnx::TensorProto* w = ConstantTensor(graph, gemm->input(1));
  if (w == nullptr || w->data_type() != onnx::TensorProto::FLOAT || w->dims_size() != 2 ||
      w->dims(trans_b ? 1 : 0) != *k) {
    return Fail("unflatten_gemm: the weight is not a float constant [K, N]");
  }
  // Only a transposed weight is read (to be written transposed); MatMul takes any other as it is,
  // so a weight kept in its file stays there: the 1 GB decoder's were a gigabyte read for nothing.
  if (trans_b && !(match.transposed_weight_values = TensorFloats(*w))) {
    return Fail("unflatten_gemm: the weight's values cannot be read");
  }
  match.n = w->dims(trans_b ? 0 : 1);
  if (gemm->input_size() > 2 && !gemm->input(2).empty()) {
    const onnx::TensorProto* c = ConstantTensor(graph, gemm->input(2));
    if (c == nullptr || c->data_type() != onnx::TensorProto::FLOAT || c->dims_size() != 1 || c->dims(0) != match.n) {
      return Fail("unflatten_gemm: the bias is not a float constant [N]");
    }
    match.bias = gemm->input(2);
  }
  const std::string& y = match.unflatten->output(0);
  bool leading_dims_kept = shapes.Rank(y) == rank && shapes.DimValue(y, -1) == match.n;
  for (int d = 0; leading_dims_kept && d + 1 < *rank; ++d) leading_dims_kept = shapes.SameDim(y, d, x, d);
  if (!leading_dims_kept) return Fail("unflatten_gemm: the second Reshape is not known to restore x's leading dims");
  return match;
}

void Rewrite(Graph& graph, const UnflattenMatch& match, PassContext& context) {
  Node* gemm = match.gemm;
  const std::string& x = match.flatten->input(0);
  const std::string& y = match.unflatten->output(0);
  const int64_t k = match.k, n = match.n;
  std::string weight = gemm->input(1);
  if (match.transposed_weight_values) {
    const std::vector<float>& values = *match.transposed_weight_values;
    std::vector<float> transposed(values.size());
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t col = 0; col < k; ++col) transposed[col * n + row] = values[row * k + col];
    }
    weight = graph.UniqueName(gemm->input(1) + "_transposed");
    graph.AddInitializer(MakeFloatTensor(weight, {k, n}, transposed));
  }
  const std::string product = match.bias.empty() ? y : graph.UniqueName(gemm->output(0) + "_matmul");
  onnx::NodeProto matmul = MakeNode("MatMul", graph.UniqueName(gemm->name().empty() ? "MatMul" : gemm->name() + "_matmul"),
                                    {x, weight}, {product});
  graph.RemoveNode(match.unflatten);
  graph.RemoveNode(gemm);
  if (!graph.HasConsumers(match.flatten->output(0)) && !graph.IsGraphOutput(match.flatten->output(0))) {
    graph.RemoveNode(match.flatten);
  }
  Node* added = graph.AddNode(std::move(matmul), gemm, /*after=*/true);
  if (!match.bias.empty()) {
    graph.AddNode(MakeNode("Add", graph.UniqueName(gemm->name().empty() ? "Add" : gemm->name() + "_bias"),
                           {product, match.bias}, {y}),
                  added, /*after=*/true);
  }
  context.CountRewrite();
}

class UnflattenGemmPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "unflatten_gemm"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Turn Reshape(-1,K) -> Gemm or MatMul -> Reshape back (GPT-2's Conv1D, Keras' Dense) into MatMul (+ Add) on "
           "the unflattened input";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    RewriteEachMatch(
        graph, context, "", [&](Node* gemm) { return MatchUnflatten(graph, gemm, shapes); },
        [&](const UnflattenMatch& match) { Rewrite(graph, match, context); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeUnflattenGemmPass() { return std::make_unique<UnflattenGemmPass>(); }

}  // namespace onnxopt
