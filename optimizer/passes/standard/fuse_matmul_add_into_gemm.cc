// fuse_matmul_add_into_gemm: a 2-D MatMul with a constant weight followed by adding a constant bias
// becomes one Gemm.
//
// Before:  A[M,K] -> MatMul(B[K,N]) -> m -> Add(C[N] or [1,N] or scalar) -> Y     After:  Gemm(A, B, C) -> Y
// A must be known (shape inference) to be rank 2; B and C constant; nothing else reads m.
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

class FuseMatMulAddIntoGemmPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fuse_matmul_add_into_gemm"; }
  absl::string_view description() const override { return "Turn a 2-D MatMul plus constant bias into Gemm"; }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    if (context.OpsetVersion("") < 11) return absl::OkStatus();  // Gemm's broadcasting C needs opset 11
    for (Node* add : graph.Nodes()) {
      if (add->removed() || add->op_type() != "Add" || !add->domain().empty()) continue;
      // Add(MatMul(x, W), bias), operands in either order.
      const std::optional<PathMatch> path = MatchPath(graph, add->output(0), {{"Add", kAnyInput}, {"MatMul"}});
      if (!path) continue;
      Node* matmul = path->nodes[1];
      const std::string& bias = path->Other(0);
      const onnx::TensorProto* weight = ConstantTensor(graph, matmul->input(1));
      const onnx::TensorProto* bias_tensor = ConstantTensor(graph, bias);
      const auto rank = shapes.Rank(matmul->input(0));
      if (weight == nullptr || bias_tensor == nullptr || weight->dims_size() != 2) continue;
      if (!rank || *rank != 2) {
        context.Skip("MatMul input is not known to be 2-D");
        continue;
      }
      const int64_t n = weight->dims(1);
      const bool bias_ok = bias_tensor->dims_size() == 0 ||
                           (bias_tensor->dims_size() == 1 && (bias_tensor->dims(0) == n || bias_tensor->dims(0) == 1)) ||
                           (bias_tensor->dims_size() == 2 && bias_tensor->dims(0) == 1 &&
                            (bias_tensor->dims(1) == n || bias_tensor->dims(1) == 1));
      if (!bias_ok || bias_tensor->data_type() != weight->data_type()) {
        context.Skip("bias does not broadcast along N");
        continue;
      }
      if (graph.Consumers(matmul->output(0)).size() != 1 || graph.IsGraphOutput(matmul->output(0))) {
        context.Skip("MatMul output has other readers");
        continue;
      }
      onnx::NodeProto gemm =
          MakeNode("Gemm", matmul->name().empty() ? graph.UniqueName("gemm") : matmul->name() + "_gemm",
                   {matmul->input(0), matmul->input(1), bias}, {add->output(0)});
      graph.RemoveNode(add);
      graph.RemoveNode(matmul);
      graph.AddNode(std::move(gemm), matmul, /*after=*/true);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseMatMulAddIntoGemmPass() { return std::make_unique<FuseMatMulAddIntoGemmPass>(); }

}  // namespace onnxopt
