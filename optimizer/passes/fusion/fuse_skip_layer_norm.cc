// fuse_skip_layer_norm: a residual Add feeding LayerNormalization (or RMSNorm's
// SimplifiedLayerNormalization) becomes ONNX Runtime's SkipLayerNormalization (or
// SkipSimplifiedLayerNormalization), absorbing a constant bias Add on one branch when there is one.
//
// Before:  s = Add(input, skip); Y = LayerNormalization(s, gamma, beta, axis=-1, epsilon)
// After:   Y = com.microsoft::SkipLayerNormalization(input, skip, gamma, beta, [bias], epsilon)
//          (SkipSimplifiedLayerNormalization(input, skip, gamma, [bias], epsilon) for RMSNorm)
// Bias:    input = Add(h, bias[N]) read only here  ->  SkipLayerNormalization(h, skip, gamma, beta, bias)
// Sum:     when s is read elsewhere too (pre-norm models: GPT-2, ViT keep the residual stream),
//          those readers take SkipLayerNormalization's 4th output, input + skip + bias.
// Needs the input known (shape inference) to be [B,S,H] and the skip [B,S,H], [1,S,H] or [S,H]
// (ONNX Runtime broadcasts those), or both [B,H]; gamma and beta 1-D constants of H, normalization
// over the last axis (run after fuse_layer_norm).
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// The skip may be the input's shape, or that shape without (or with 1 for) the batch dim.
bool SkipShapeFits(const ShapeInfo& shapes, const std::string& input, const std::string& skip) {
  if (shapes.SameShape(input, skip)) return true;
  const auto rank = shapes.Rank(skip);
  if (!rank || (*rank != 2 && *rank != 3)) return false;
  if (*rank == 3 && shapes.DimValue(skip, 0) != 1) return false;
  return shapes.SameDim(skip, -1, input, -1) && shapes.SameDim(skip, -2, input, -2);
}

class FuseSkipLayerNormPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_skip_layer_norm"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override {
    return "Fuse a residual Add (and a bias Add) with LayerNormalization or RMSNorm into (Simplified)SkipLayerNormalization";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    for (Node* norm : graph.Nodes()) {
      if (norm->removed() || !norm->domain().empty()) continue;
      const bool simplified = norm->op_type() == "SimplifiedLayerNormalization";
      if (norm->op_type() != "LayerNormalization" && !simplified) continue;
      // LayerNormalization needs its beta; neither may use its mean/inv-std outputs.
      if (norm->input_size() != (simplified ? 2 : 3) || norm->output_size() != 1) continue;
      Node* add = graph.Producer(norm->input(0));
      if (add == nullptr || add->op_type() != "Add" || !add->domain().empty() || add->input_size() != 2) continue;
      const int64_t axis = norm->GetAttributeInt("axis", -1);
      if (axis != -1 && axis != 2) continue;
      // The full [B,S,H] operand is the input; the other may broadcast.
      std::string input, skip;
      for (int side = 0; side < 2 && input.empty(); ++side) {
        const auto rank = shapes->Rank(add->input(side));
        if (rank && (*rank == 3 || (*rank == 2 && shapes->SameShape(add->input(0), add->input(1)))) &&
            shapes->SameShape(add->input(side), add->output(0)) &&
            SkipShapeFits(*shapes, add->input(side), add->input(1 - side))) {
          input = add->input(side);
          skip = add->input(1 - side);
        }
      }
      if (input.empty()) {
        context.Skip("fuse_skip_layer_norm: residual inputs are not known to be [B,S,H] and a skip ONNX Runtime broadcasts");
        continue;
      }
      if (input == skip) continue;  // Add(y, y): one value cannot be both
      const onnx::TensorProto* gamma = ConstantTensor(graph, norm->input(1));
      const onnx::TensorProto* beta = simplified ? gamma : ConstantTensor(graph, norm->input(2));
      const auto width = shapes->DimValue(input, -1);
      if (gamma == nullptr || beta == nullptr || gamma->dims_size() != 1 || beta->dims_size() != 1 || !width ||
          gamma->dims(0) != *width || beta->dims(0) != *width) {
        continue;
      }
      // Other readers of the sum take output 3.
      const bool sum_read_elsewhere = graph.Consumers(add->output(0)).size() > 1 || graph.IsGraphOutput(add->output(0));
      std::string bias;
      Node* bias_add = nullptr;
      for (const std::string* operand : {&input, &skip}) {
        Node* candidate = graph.Producer(*operand);
        if (!bias.empty() || candidate == nullptr || candidate->op_type() != "Add" || !candidate->domain().empty() ||
            candidate->input_size() != 2 || graph.Consumers(candidate->output(0)).size() != 1 ||
            graph.IsGraphOutput(candidate->output(0)) || !shapes->SameShape(candidate->output(0), add->output(0))) {
          continue;
        }
        for (int k = 0; k < 2; ++k) {
          const onnx::TensorProto* constant = ConstantTensor(graph, candidate->input(k));
          if (constant != nullptr && constant->dims_size() == 1 && constant->dims(0) == gamma->dims(0) &&
              shapes->SameShape(candidate->input(1 - k), add->output(0))) {
            bias = candidate->input(k);
            bias_add = candidate;
            // The biased operand is the full one: it becomes the input, the other the skip.
            const std::string other = operand == &input ? skip : input;
            input = candidate->input(1 - k);
            skip = other;
            break;
          }
        }
      }
      onnx::NodeProto fused;
      fused.set_op_type(simplified ? "SkipSimplifiedLayerNormalization" : "SkipLayerNormalization");
      fused.set_domain("com.microsoft");
      fused.set_name(graph.UniqueName(simplified ? "SkipRMSNorm" : "SkipLayerNorm"));
      for (const std::string& name : {input, skip, norm->input(1)}) fused.add_input(name);
      if (!simplified) fused.add_input(norm->input(2));
      if (!bias.empty()) fused.add_input(bias);
      fused.add_output(norm->output(0));
      if (sum_read_elsewhere) {
        fused.add_output("");  // mean
        fused.add_output("");  // inv_std_var
        fused.add_output(add->output(0));
      }
      *fused.add_attribute() = FloatAttribute("epsilon", norm->GetAttributeFloat("epsilon", 1e-5f));
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
