// unflatten_gemm: a Gemm between a flattening and an unflattening Reshape (how GPT-2's Conv1D and
// other addmm-based projections export) becomes MatMul + Add on the original tensor, the form the
// attention, bias-Gelu and SkipLayerNormalization fusions read.
//
// Before:  f = Reshape(x[..., K], [-1, K]); g = Gemm(f, W[K,N] (or [N,K] with transB), b[N]);
//          y = Reshape(g, <x's leading dims> + [N])
// After:   y = Add(MatMul(x, W[K,N]), b)
// Checked: x has rank >= 3 with a static last dim K, the flattening target is the constant [-1, K],
// Gemm has alpha = beta = 1 and no transA, W and b are float constants, g is read only by the second
// Reshape, and shape inference proves y's leading dims are x's.
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class UnflattenGemmPass final : public Pass {
 public:
  absl::string_view name() const override { return "unflatten_gemm"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override {
    return "Turn Reshape(-1,K) -> Gemm -> Reshape back (GPT-2's Conv1D) into MatMul + Add on the unflattened input";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    for (Node* gemm : graph.Nodes()) {
      if (gemm->removed() || gemm->op_type() != "Gemm" || !gemm->domain().empty() || gemm->output_size() != 1) continue;
      Node* flatten = ProducerWithOp(graph, gemm->input(0), "Reshape");
      Node* unflatten = SoleConsumer(graph, gemm->output(0));
      if (flatten == nullptr || unflatten == nullptr || unflatten->op_type() != "Reshape" ||
          unflatten->input(0) != gemm->output(0)) {
        continue;
      }
      const std::string& x = flatten->input(0);
      const auto rank = shapes->Rank(x);
      const auto k = shapes->DimValue(x, -1);
      const auto target = ConstantInts(graph, flatten->input(1));
      if (!rank || *rank < 3 || !k || !target || *target != std::vector<int64_t>{-1, *k}) {
        context.Skip("unflatten_gemm: the Gemm input is not x flattened to [-1, K]");
        continue;
      }
      if (gemm->GetAttributeInt("transA", 0) != 0 || gemm->GetAttributeFloat("alpha", 1.0f) != 1.0f ||
          gemm->GetAttributeFloat("beta", 1.0f) != 1.0f) {
        context.Skip("unflatten_gemm: Gemm scales or transposes its input");
        continue;
      }
      const bool trans_b = gemm->GetAttributeInt("transB", 0) != 0;
      const onnx::TensorProto* w = ConstantTensor(graph, gemm->input(1));
      if (w == nullptr || w->data_type() != onnx::TensorProto::FLOAT || w->dims_size() != 2 ||
          w->dims(trans_b ? 1 : 0) != *k) {
        context.Skip("unflatten_gemm: the weight is not a float constant [K, N]");
        continue;
      }
      // Only a transposed weight is read (to be written transposed); MatMul takes any other as it is,
      // so a weight kept in its file stays there: the 1 GB decoder's were a gigabyte read for nothing.
      std::optional<std::vector<float>> w_values;
      if (trans_b && !(w_values = TensorFloats(*w))) {
        context.Skip("unflatten_gemm: the weight's values cannot be read");
        continue;
      }
      const int64_t n = w->dims(trans_b ? 0 : 1);
      std::string bias;
      if (gemm->input_size() > 2 && !gemm->input(2).empty()) {
        const onnx::TensorProto* c = ConstantTensor(graph, gemm->input(2));
        if (c == nullptr || c->data_type() != onnx::TensorProto::FLOAT || c->dims_size() != 1 || c->dims(0) != n) {
          context.Skip("unflatten_gemm: the bias is not a float constant [N]");
          continue;
        }
        bias = gemm->input(2);
      }
      const std::string& y = unflatten->output(0);
      bool leading_dims_kept = shapes->Rank(y) == rank && shapes->DimValue(y, -1) == n;
      for (int d = 0; leading_dims_kept && d + 1 < *rank; ++d) leading_dims_kept = shapes->SameDim(y, d, x, d);
      if (!leading_dims_kept) {
        context.Skip("unflatten_gemm: the second Reshape is not known to restore x's leading dims");
        continue;
      }
      std::string weight = gemm->input(1);
      if (trans_b) {
        std::vector<float> transposed(w_values->size());
        for (int64_t row = 0; row < n; ++row) {
          for (int64_t col = 0; col < *k; ++col) transposed[col * n + row] = (*w_values)[row * *k + col];
        }
        weight = graph.UniqueName(gemm->input(1) + "_transposed");
        graph.AddInitializer(MakeFloatTensor(weight, {*k, n}, transposed));
      }
      const std::string product = bias.empty() ? y : graph.UniqueName(gemm->output(0) + "_matmul");
      onnx::NodeProto matmul;
      matmul.set_op_type("MatMul");
      matmul.set_name(graph.UniqueName(gemm->name().empty() ? "MatMul" : gemm->name() + "_matmul"));
      matmul.add_input(x);
      matmul.add_input(weight);
      matmul.add_output(product);
      graph.RemoveNode(unflatten);
      graph.RemoveNode(gemm);
      if (!graph.HasConsumers(flatten->output(0)) && !graph.IsGraphOutput(flatten->output(0))) graph.RemoveNode(flatten);
      Node* added = graph.AddNode(std::move(matmul), gemm, /*after=*/true);
      if (!bias.empty()) {
        onnx::NodeProto add;
        add.set_op_type("Add");
        add.set_name(graph.UniqueName(gemm->name().empty() ? "Add" : gemm->name() + "_bias"));
        add.add_input(product);
        add.add_input(bias);
        add.add_output(y);
        graph.AddNode(std::move(add), added, /*after=*/true);
      }
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeUnflattenGemmPass() { return std::make_unique<UnflattenGemmPass>(); }

}  // namespace onnxopt
