// fuse_conv_add_mul: folds a per-channel constant Add (bias) or Mul (scale) after a Conv into it.
//
// Before:  X -> Conv(W, B) -> c -> Add(K[C,1,1])  -> Y      After:  X -> Conv(W, B + K) -> Y
//          X -> Conv(W, B) -> c -> Mul(S[C,1,1])  -> Y              X -> Conv(W * S, B * S) -> Y
// K and S may be [C,1,...,1], [1,C,1,...,1], [1] or a scalar, float32 constants; W (and B) float32
// constants; nothing else reads the Conv's output.
#include "optimizer/passes/bypass.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

class FuseConvAddMulPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_conv_add_mul"; }
  absl::string_view description() const override { return "Fold a per-channel constant Add or Mul into the Conv before it"; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* op : graph.Nodes()) {
      if ((op->op_type() != "Add" && op->op_type() != "Mul") || !op->domain().empty() || op->input_size() != 2) continue;
      // Add(Conv(..), k) or Mul(Conv(..), k), operands in either order.
      const auto has_weight = [](const Graph&, const Node& conv, int) { return conv.input_size() >= 2; };
      const std::optional<PathMatch> path =
          MatchPath(graph, op->output(0), {{op->op_type() == "Mul" ? "Mul" : "Add", kAnyInput}, {"Conv", 0, has_weight}});
      if (!path) continue;
      Node* conv = path->nodes[1];
      const onnx::TensorProto* weight = ConstantTensor(graph, conv->input(1));
      const onnx::TensorProto* operand = ConstantTensor(graph, path->Other(0));
      if (weight == nullptr || operand == nullptr || weight->dims_size() < 3) continue;
      const int64_t channels = weight->dims(0);
      auto w = TensorFloats(*weight);
      auto k = ChannelFloats(*operand, channels, weight->dims_size());
      const bool has_bias = conv->input_size() > 2 && !conv->input(2).empty();
      std::optional<std::vector<float>> b = has_bias ? ConstantFloats(graph, conv->input(2))
                                                     : std::optional<std::vector<float>>(std::vector<float>(channels, 0));
      if (!w || !k || !b || static_cast<int64_t>(b->size()) != channels) {
        context.Skip("operand is not a per-channel float constant, or Conv weights are not constant");
        continue;
      }
      if (graph.Consumers(conv->output(0)).size() != 1 || graph.IsGraphOutput(conv->output(0))) {
        context.Skip("Conv output has other readers");
        continue;
      }
      const bool is_mul = op->op_type() == "Mul";
      const size_t per_channel = w->size() / static_cast<size_t>(channels);
      for (int64_t c = 0; c < channels; ++c) {
        const float factor = (*k)[static_cast<size_t>(c)];
        if (is_mul) {
          for (size_t i = 0; i < per_channel; ++i) (*w)[static_cast<size_t>(c) * per_channel + i] *= factor;
          (*b)[static_cast<size_t>(c)] *= factor;
        } else {
          (*b)[static_cast<size_t>(c)] += factor;
        }
      }
      onnx::NodeProto fused = conv->proto();
      if (is_mul) {
        const std::string w_name = graph.UniqueName(conv->input(1) + "_scaled");
        graph.AddInitializer(MakeFloatTensor(w_name, {weight->dims().begin(), weight->dims().end()}, *w));
        fused.set_input(1, w_name);
      }
      const std::string b_name = graph.UniqueName(conv->name().empty() ? "conv_bias" : conv->name() + "_bias");
      graph.AddInitializer(MakeFloatTensor(b_name, {channels}, *b));
      if (has_bias) {
        fused.set_input(2, b_name);
      } else {
        fused.add_input(b_name);
      }
      fused.set_output(0, op->output(0));
      graph.RemoveNode(op);
      graph.RemoveNode(conv);
      graph.AddNode(std::move(fused), conv, /*after=*/true);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseConvAddMulPass() { return std::make_unique<FuseConvAddMulPass>(); }

}  // namespace onnxopt
