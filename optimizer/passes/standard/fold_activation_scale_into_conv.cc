// fold_activation_scale_into_conv: a constant scalar scale after a Conv's hard-swish (or ReLU) folds
// into the Conv, the activation adjusted to the scaled input.
//
// Before:  X = Conv(x, W, B);  y = Mul(X, HardSigmoid(X, alpha, beta)) * a
// After:   X' = Conv(x, a W, a B);  y = Mul(X', HardSigmoid(X', alpha / a, beta))
// since a X * clip(alpha X + beta, 0, 1) = X' * clip((alpha / a) X' + beta, 0, 1) for X' = a X, a != 0
// (any sign). Likewise Relu(X) * a = Relu(a X) for a > 0. PP-LCNetV3's learnable affine blocks
// (PP-OCRv4) scale every activation so; with the scale gone, the shift left of the block folds into a
// pointwise Conv after it (fold_affine_into_conv). A division by a constant is a scale by its inverse.
//
// The scale one float constant; W, B float32 constants; X read by the activation alone, the
// activation's values by nothing but the pattern.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

struct ScaledActivation {
  Node* conv = nullptr;
  Node* gate = nullptr;     // HardSigmoid(X) of a hard-swish, or nullptr for a ReLU
  Node* product = nullptr;  // Mul(X, gate), or the Relu
  Node* scale = nullptr;    // the Mul/Div by the constant
  float factor = 1.0f;
  std::vector<float> weight, bias;
};

// The activation writing `value`: a hard-swish Mul(X, HardSigmoid(X)) or a Relu, of a Conv's output X
// that nothing else reads.
MatchResult<ScaledActivation> MatchActivation(const Graph& graph, Node* product) {
  ScaledActivation match;
  match.product = product;
  std::string x;
  if (product->op_type() == "Relu" && product->domain().empty()) {
    x = product->input(0);
    if (SoleConsumer(graph, x) != product) return Fail();
  } else if (product->op_type() == "Mul" && product->domain().empty() && product->input_size() == 2) {
    for (int i = 0; i < 2 && match.gate == nullptr; ++i) {
      Node* gate = ProducerWithOp(graph, product->input(i), "HardSigmoid");
      if (gate != nullptr && gate->input(0) == OtherInput(*product, i)) match.gate = gate;
    }
    if (match.gate == nullptr || SoleConsumer(graph, match.gate->output(0)) != product) return Fail();
    x = match.gate->input(0);
    const std::vector<Node*>& readers = graph.Readers(x);
    if (readers.size() != 2 || graph.IsGraphOutput(x)) return Fail();
  } else {
    return Fail();
  }
  match.conv = ProducerWithOp(graph, x, "Conv");
  if (match.conv == nullptr) return Fail();
  return match;
}

MatchResult<ScaledActivation> MatchScaledActivation(const Graph& graph, Node* scale) {
  std::optional<std::pair<float, std::string>> scaled = ScalarScale(graph, scale);
  if (!scaled) return Fail();
  Node* product = graph.Producer(scaled->second);
  if (product == nullptr || SoleConsumer(graph, scaled->second) != scale) return Fail();
  MatchResult<ScaledActivation> match = MatchActivation(graph, product);
  if (!match) return match.failure();
  match->scale = scale;
  match->factor = scaled->first;
  if (!std::isfinite(match->factor) || match->factor == 0.0f) return Fail("the scale is zero or not finite");
  if (match->gate == nullptr && match->factor < 0.0f) return Fail("a negative scale does not pass through a ReLU");
  Node* conv = match->conv;
  const onnx::TensorProto* weight = conv->input_size() >= 2 ? ConstantTensor(graph, conv->input(1)) : nullptr;
  std::optional<std::vector<float>> w = weight != nullptr ? TensorFloats(*weight) : std::nullopt;
  const bool has_bias = conv->input_size() > 2 && !conv->input(2).empty();
  std::optional<std::vector<float>> bias = has_bias ? ConstantFloats(graph, conv->input(2)) : std::vector<float>();
  if (!w || !bias || weight->dims_size() < 3) return Fail("the Conv's weights or bias are not float constants");
  // A one-element constant of higher rank than the Conv's output would broadcast it to that rank.
  const int scaled_index = scale->input(0) == scaled->second ? 0 : 1;
  const onnx::TensorProto* constant = ConstantTensor(graph, OtherInput(*scale, scaled_index));
  if (constant == nullptr || constant->dims_size() > weight->dims_size()) return Fail("the scale raises the rank");
  match->weight = *std::move(w);
  match->bias = *std::move(bias);
  return match;
}

// `node` again with its output named `output` (the removed scale's) and `alpha` where it has one.
onnx::NodeProto Rewritten(const Node& node, const std::string& output, std::optional<float> alpha = std::nullopt) {
  onnx::NodeProto proto = node.proto();
  proto.set_output(0, output);
  if (alpha) {
    proto.clear_attribute();
    for (const auto& attribute : node.proto().attribute()) {
      if (attribute.name() != "alpha") *proto.add_attribute() = attribute;
    }
    *proto.add_attribute() = MakeFloatAttribute("alpha", *alpha);
  }
  return proto;
}

void Rewrite(Graph& graph, PassContext& context, ScaledActivation match) {
  Node* conv = match.conv;
  for (float& value : match.weight) value *= match.factor;
  for (float& value : match.bias) value *= match.factor;
  onnx::NodeProto scaled_conv = conv->proto();
  const onnx::TensorProto& weight = *ConstantTensor(graph, conv->input(1));
  const std::string weight_name = graph.UniqueName(conv->input(1) + "_activation_scaled");
  graph.AddInitializer(MakeFloatTensor(weight_name, {weight.dims().begin(), weight.dims().end()}, match.weight));
  scaled_conv.set_input(1, weight_name);
  if (!match.bias.empty()) {
    const std::string bias_name = graph.UniqueName(conv->input(2) + "_activation_scaled");
    graph.AddInitializer(MakeFloatTensor(bias_name, {static_cast<int64_t>(match.bias.size())}, match.bias));
    scaled_conv.set_input(2, bias_name);
  }
  const std::string output = match.scale->output(0);
  onnx::NodeProto product = Rewritten(*match.product, output);
  graph.RemoveNode(match.scale);
  graph.RemoveNode(match.product);
  graph.AddNode(std::move(scaled_conv), conv, /*after=*/true);
  graph.RemoveNode(conv);
  if (match.gate != nullptr) {
    const float alpha = match.gate->GetAttributeFloat("alpha", 0.2f) / match.factor;
    graph.AddNode(Rewritten(*match.gate, match.gate->output(0), alpha), match.gate, /*after=*/true);
    graph.RemoveNode(match.gate);
  }
  graph.AddNode(std::move(product), match.product, /*after=*/true);
  context.CountRewrite();
}

class FoldActivationScaleIntoConvPass final : public Pass {
 public:
  absl::string_view name() const override { return "fold_activation_scale_into_conv"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fold a constant scalar scale after a Conv's hard-swish (x * HardSigmoid(x)) or ReLU into the Conv";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    RewriteEachMatch(
        graph, context, "fold_activation_scale_into_conv: ",
        [&](Node* node) { return MatchScaledActivation(graph, node); },
        [&](ScaledActivation match) { Rewrite(graph, context, std::move(match)); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFoldActivationScaleIntoConvPass() {
  return std::make_unique<FoldActivationScaleIntoConvPass>();
}

}  // namespace onnxopt
