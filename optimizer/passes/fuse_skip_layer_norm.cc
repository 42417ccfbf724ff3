// fuse_skip_layer_norm: a residual Add feeding LayerNormalization becomes ONNX Runtime's
// SkipLayerNormalization, absorbing a constant bias Add on one branch when there is one.
//
// Before:  s = Add(input, skip); Y = LayerNormalization(s, gamma, beta, axis=-1, epsilon)
// After:   Y = com.microsoft::SkipLayerNormalization(input, skip, gamma, beta, [bias], epsilon)
// Bias:    input = Add(h, bias[N]) read only here  ->  SkipLayerNormalization(h, skip, gamma, beta, bias)
// Needs input and skip known (shape inference) to be 3-D with the same shape, gamma and beta 1-D
// constants, normalization over the last axis, and s read by nothing else (run after fuse_layer_norm).
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class FuseSkipLayerNormPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_skip_layer_norm"; }
  absl::string_view description() const override {
    return "Fuse a residual Add (and a bias Add) with LayerNormalization into SkipLayerNormalization";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    for (Node* norm : graph.Nodes()) {
      if (norm->removed() || norm->op_type() != "LayerNormalization" || !norm->domain().empty()) continue;
      if (norm->input_size() < 3 || norm->output_size() != 1) continue;  // needs beta; no mean/inv-std outputs
      Node* add = graph.Producer(norm->input(0));
      if (add == nullptr || add->op_type() != "Add" || !add->domain().empty() || add->input_size() != 2) continue;
      const auto rank = shapes->Rank(add->input(0));
      const int64_t axis = norm->GetAttributeInt("axis", -1);
      if (!rank || *rank != 3 || (axis != -1 && axis != 2)) continue;
      if (!shapes->SameShape(add->input(0), add->input(1))) {
        context.Skip("fuse_skip_layer_norm: residual inputs are not known to have one 3-D shape");
        continue;
      }
      if (graph.Consumers(add->output(0)).size() != 1 || graph.IsGraphOutput(add->output(0))) {
        context.Skip("fuse_skip_layer_norm: the residual sum is read elsewhere");
        continue;
      }
      const onnx::TensorProto* gamma = ConstantTensor(graph, norm->input(1));
      const onnx::TensorProto* beta = ConstantTensor(graph, norm->input(2));
      if (gamma == nullptr || beta == nullptr || gamma->dims_size() != 1 || beta->dims_size() != 1) continue;
      std::string input = add->input(0), skip = add->input(1), bias;
      Node* bias_add = nullptr;
      for (int side = 0; side < 2 && bias.empty(); ++side) {
        Node* candidate = graph.Producer(add->input(side));
        if (candidate == nullptr || candidate->op_type() != "Add" || !candidate->domain().empty() ||
            candidate->input_size() != 2 || graph.Consumers(candidate->output(0)).size() != 1 ||
            graph.IsGraphOutput(candidate->output(0))) {
          continue;
        }
        for (int k = 0; k < 2; ++k) {
          const onnx::TensorProto* constant = ConstantTensor(graph, candidate->input(k));
          if (constant != nullptr && constant->dims_size() == 1 && constant->dims(0) == gamma->dims(0)) {
            bias = candidate->input(k);
            input = candidate->input(1 - k);
            skip = add->input(1 - side);
            bias_add = candidate;
            break;
          }
        }
      }
      onnx::NodeProto fused;
      fused.set_op_type("SkipLayerNormalization");
      fused.set_domain("com.microsoft");
      fused.set_name(graph.UniqueName("SkipLayerNorm"));
      for (const std::string& name : {input, skip, norm->input(1), norm->input(2)}) fused.add_input(name);
      if (!bias.empty()) fused.add_input(bias);
      fused.add_output(norm->output(0));
      auto* epsilon = fused.add_attribute();
      epsilon->set_name("epsilon");
      epsilon->set_type(onnx::AttributeProto::FLOAT);
      epsilon->set_f(norm->GetAttributeFloat("epsilon", 1e-5f));
      graph.RemoveNode(norm);
      graph.RemoveNode(add);
      if (bias_add != nullptr) graph.RemoveNode(bias_add);
      graph.AddNode(std::move(fused), norm, /*after=*/true);
      context.RequireOpset("com.microsoft", 1);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseSkipLayerNormPass() { return std::make_unique<FuseSkipLayerNormPass>(); }

}  // namespace onnxopt
