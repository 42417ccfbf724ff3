// fuse_matmul_add_into_gemm: a 2-D MatMul with a constant weight followed by adding a constant bias
// becomes one Gemm.
//
// Before:  A[M,K] -> MatMul(B[K,N]) -> m -> Add(C[N] or [1,N] or scalar) -> Y     After:  Gemm(A, B, C) -> Y
// A must be known (shape inference) to be rank 2; B and C constant; nothing else reads m.
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class FuseMatMulAddIntoGemmPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_matmul_add_into_gemm"; }
  absl::string_view description() const override { return "Turn a 2-D MatMul plus constant bias into Gemm"; }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    if (context.OpsetVersion("") < 11) return absl::OkStatus();  // Gemm's broadcasting C needs opset 11
    for (Node* add : graph.Nodes()) {
      if (add->op_type() != "Add" || !add->domain().empty() || add->input_size() != 2) continue;
      for (int side = 0; side < 2; ++side) {
        Node* matmul = graph.Producer(add->input(side));
        if (matmul == nullptr || matmul->op_type() != "MatMul" || !matmul->domain().empty()) continue;
        const std::string bias = add->input(1 - side);
        const onnx::TensorProto* weight = ConstantTensor(graph, matmul->input(1));
        const onnx::TensorProto* bias_tensor = ConstantTensor(graph, bias);
        const auto rank = context.shapes() ? context.shapes()->Rank(matmul->input(0)) : std::nullopt;
        if (weight == nullptr || bias_tensor == nullptr || weight->dims_size() != 2) break;
        if (!rank || *rank != 2) {
          context.Skip("MatMul input is not known to be 2-D");
          break;
        }
        const int64_t n = weight->dims(1);
        const bool bias_ok = bias_tensor->dims_size() == 0 ||
                             (bias_tensor->dims_size() == 1 && (bias_tensor->dims(0) == n || bias_tensor->dims(0) == 1)) ||
                             (bias_tensor->dims_size() == 2 && bias_tensor->dims(0) == 1 &&
                              (bias_tensor->dims(1) == n || bias_tensor->dims(1) == 1));
        if (!bias_ok || bias_tensor->data_type() != weight->data_type()) {
          context.Skip("bias does not broadcast along N");
          break;
        }
        if (graph.Consumers(matmul->output(0)).size() != 1 || graph.IsGraphOutput(matmul->output(0))) {
          context.Skip("MatMul output has other readers");
          break;
        }
        onnx::NodeProto gemm;
        gemm.set_op_type("Gemm");
        gemm.set_name(matmul->name().empty() ? graph.UniqueName("gemm") : matmul->name() + "_gemm");
        gemm.add_input(matmul->input(0));
        gemm.add_input(matmul->input(1));
        gemm.add_input(bias);
        gemm.add_output(add->output(0));
        graph.RemoveNode(add);
        graph.RemoveNode(matmul);
        graph.AddNode(std::move(gemm), matmul, /*after=*/true);
        context.CountRewrite();
        break;
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseMatMulAddIntoGemmPass() { return std::make_unique<FuseMatMulAddIntoGemmPass>(); }

}  // namespace onnxopt
