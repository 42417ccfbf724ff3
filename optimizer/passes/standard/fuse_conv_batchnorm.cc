// fuse_conv_batchnorm: folds an inference BatchNormalization into the Conv before it.
//
// Before:  X -> Conv(W, B) -> c -> BatchNormalization(scale, bias, mean, var, eps) -> Y
// After:   X -> Conv(W', B') -> Y,   W' = W * f (per output channel),  B' = (B - mean) * f + bias,
//          f = scale / sqrt(var + eps)
// Needs float32 constant W, B, scale, bias, mean and var, one output channel per BN channel, and the
// Conv output read by nothing else. BN in training mode (opset 14+) or with its running-stat outputs
// in use is left alone.
#include <cmath>

#include "optimizer/passes/bypass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class FuseConvBatchNormPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_conv_batchnorm"; }
  absl::string_view description() const override { return "Fold BatchNormalization into the preceding Conv"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* bn : graph.Nodes()) {
      if (bn->op_type() != "BatchNormalization" || !bn->domain().empty() || bn->input_size() != 5) continue;
      Node* conv = graph.Producer(bn->input(0));
      if (conv == nullptr || conv->op_type() != "Conv" || !conv->domain().empty() || conv->input_size() < 2) continue;
      if (bn->GetAttributeInt("training_mode", 0) != 0 || (bn->output_size() > 1 && UsesExtraOutputs(graph, *bn))) {
        context.Skip("BatchNormalization in training mode");
        continue;
      }
      if (graph.Consumers(conv->output(0)).size() != 1 || graph.IsGraphOutput(conv->output(0))) {
        context.Skip("Conv output has other readers");
        continue;
      }
      const onnx::TensorProto* weight = ConstantTensor(graph, conv->input(1));
      auto w = weight ? TensorFloats(*weight) : std::nullopt;
      auto scale = ConstantFloats(graph, bn->input(1));
      auto bias = ConstantFloats(graph, bn->input(2));
      auto mean = ConstantFloats(graph, bn->input(3));
      auto var = ConstantFloats(graph, bn->input(4));
      std::optional<std::vector<float>> b;
      const bool has_bias = conv->input_size() > 2 && !conv->input(2).empty();
      if (has_bias) b = ConstantFloats(graph, conv->input(2));
      if (!w || !scale || !bias || !mean || !var || (has_bias && !b) || weight->dims_size() < 1) {
        context.Skip("Conv weights or BatchNormalization parameters are not float32 constants");
        continue;
      }
      const size_t channels = static_cast<size_t>(weight->dims(0));
      if (channels == 0 || scale->size() != channels || bias->size() != channels || mean->size() != channels ||
          var->size() != channels || (b && b->size() != channels) || w->size() % channels != 0) {
        context.Skip("channel counts do not match");
        continue;
      }
      const float epsilon = bn->GetAttributeFloat("epsilon", 1e-5f);
      const size_t per_channel = w->size() / channels;
      std::vector<float> new_w(*w);
      std::vector<float> new_b(channels);
      for (size_t c = 0; c < channels; ++c) {
        const float factor = (*scale)[c] / std::sqrt((*var)[c] + epsilon);
        for (size_t k = 0; k < per_channel; ++k) new_w[c * per_channel + k] *= factor;
        new_b[c] = ((b ? (*b)[c] : 0.0f) - (*mean)[c]) * factor + (*bias)[c];
      }
      std::vector<int64_t> dims(weight->dims().begin(), weight->dims().end());
      const std::string w_name = graph.UniqueName(conv->input(1) + "_bn");
      const std::string b_name = graph.UniqueName(conv->name().empty() ? "conv_bias_bn" : conv->name() + "_bias_bn");
      graph.AddInitializer(MakeFloatTensor(w_name, dims, new_w));
      graph.AddInitializer(MakeFloatTensor(b_name, {static_cast<int64_t>(channels)}, new_b));
      graph.SetInput(conv, 1, w_name);
      if (has_bias) {
        graph.SetInput(conv, 2, b_name);
      } else {
        onnx::NodeProto replacement = conv->proto();
        replacement.add_input(b_name);
        Node* rebuilt = graph.AddNode(std::move(replacement), conv, /*after=*/true);
        graph.RemoveNode(conv);
        conv = rebuilt;
      }
      BypassNode(graph, bn, conv->output(0), bn->output(0), context);
    }
    return absl::OkStatus();
  }

 private:
  static bool UsesExtraOutputs(const Graph& graph, const Node& bn) {
    for (int i = 1; i < bn.output_size(); ++i) {
      if (!bn.output(i).empty() && (graph.HasConsumers(bn.output(i)) || graph.IsGraphOutput(bn.output(i)))) return true;
    }
    return false;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseConvBatchNormPass() { return std::make_unique<FuseConvBatchNormPass>(); }

}  // namespace onnxopt
