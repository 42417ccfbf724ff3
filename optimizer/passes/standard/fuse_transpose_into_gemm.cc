// fuse_transpose_into_gemm: a 2-D Transpose feeding Gemm (or a 2-D MatMul) becomes Gemm's transA /
// transB attribute.
//
// Before:  A -> Transpose(perm=[1,0]) -> At -> Gemm(At, B, C; transA=0) -> Y
// After:   A -> Gemm(A, B, C; transA=1) -> Y
// Before:  B -> Transpose(perm=[1,0]) -> Bt -> MatMul(A[M,K], Bt) -> Y        (A and B 2-D)
// After:   Gemm(A, B; transB=1) -> Y
// MatMul needs both operands known (shape inference) to be 2-D, and opset 11+ (Gemm without C).
// The Transpose stays if something else reads its output.
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

bool IsTranspose2D(const Node* node) {
  if (node == nullptr || node->op_type() != "Transpose" || !node->domain().empty()) return false;
  const onnx::AttributeProto* perm = node->FindAttribute("perm");
  return perm != nullptr && perm->ints_size() == 2 && perm->ints(0) == 1 && perm->ints(1) == 0;
}

void SetIntAttribute(onnx::NodeProto* node, const std::string& name, int64_t value) {
  for (auto& attribute : *node->mutable_attribute()) {
    if (attribute.name() == name) {
      attribute.set_i(value);
      return;
    }
  }
  auto* attribute = node->add_attribute();
  attribute->set_name(name);
  attribute->set_type(onnx::AttributeProto::INT);
  attribute->set_i(value);
}

class FuseTransposeIntoGemmPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fuse_transpose_into_gemm"; }
  absl::string_view description() const override {
    return "Fold 2-D Transposes feeding Gemm or a 2-D MatMul into Gemm's transA/transB";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    const int64_t opset = context.OpsetVersion("");
    for (Node* node : graph.Nodes()) {
      if (node->removed() || !node->domain().empty() || node->input_size() < 2) continue;
      const bool is_gemm = node->op_type() == "Gemm";
      if (!is_gemm && node->op_type() != "MatMul") continue;
      Node* left = graph.Producer(node->input(0));
      Node* right = graph.Producer(node->input(1));
      const bool fold_left = IsTranspose2D(left);
      const bool fold_right = IsTranspose2D(right);
      if (!fold_left && !fold_right) continue;
      if (!is_gemm) {
        const auto a = shapes.Rank(node->input(0));
        const auto b = shapes.Rank(node->input(1));
        if (opset < 11 || !a || !b || *a != 2 || *b != 2) {
          context.Skip("MatMul operands are not known to be 2-D");
          continue;
        }
      }
      onnx::NodeProto fused = node->proto();
      if (!is_gemm) {
        fused.set_op_type("Gemm");
        fused.clear_attribute();
      }
      const std::string left_input = fold_left ? left->input(0) : node->input(0);
      const std::string right_input = fold_right ? right->input(0) : node->input(1);
      fused.set_input(0, left_input);
      fused.set_input(1, right_input);
      if (fold_left) SetIntAttribute(&fused, "transA", 1 - node->GetAttributeInt("transA", 0) * is_gemm);
      if (fold_right) SetIntAttribute(&fused, "transB", 1 - node->GetAttributeInt("transB", 0) * is_gemm);
      graph.RemoveNode(node);
      graph.AddNode(std::move(fused), node, /*after=*/true);
      context.CountRewrite();
      for (Node* transpose : {fold_left ? left : nullptr, fold_right ? right : nullptr}) {
        if (transpose != nullptr && !transpose->removed() && !graph.HasConsumers(transpose->output(0)) &&
            !graph.IsGraphOutput(transpose->output(0))) {
          graph.RemoveNode(transpose);
        }
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseTransposeIntoGemmPass() { return std::make_unique<FuseTransposeIntoGemmPass>(); }

}  // namespace onnxopt
