// fold_affine_into_conv: a constant per-channel affine map on a Conv's input folds into that Conv's
// weights and bias, where the Conv pads nothing.
//
// Before:  x -> Mul(S) -> Add(T) -> Conv(W, B) -> y         (S, T: [C,1,1], [1,C,1,1], [1] or scalar)
// After:   x -> Conv(W', B') -> y    W'[o, i, k] = W[o, i, k] * S[c],  B'[o] = B[o] + sum_{i,k} W[o, i, k] * T[c]
// with c the input channel that weight [o, i] reads (group g of o: c = g * C/group + i). Either of
// the Mul and the Add may be missing. PP-LCNetV3's learnable affine blocks (PP-OCRv4's detector and
// recognizer) write one after every activation: the ones before a pointwise Conv cost two passes over
// the activations each, 12 of them in the recognizer.
//
// Exact only where every position the Conv reads is an input position: with padding the border reads
// zeros the affine map would have moved to T, so any non-zero pads (or auto_pad SAME_*) keep the
// map. W, B, S and T float32 constants; nothing but the next node reads the Mul's or the Add's output;
// x of the Conv's rank and channels (inferred shapes), so that the map broadcasts nothing.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

struct InputAffine {
  Node* conv = nullptr;
  Node* mul = nullptr;  // x * S, or nullptr
  Node* add = nullptr;  // (x * S) + T, or nullptr
  std::string x;        // what the Conv reads after the rewrite
  std::vector<float> scale, shift;  // per input channel (1 and 0 where a node is missing)
  std::vector<float> weight, bias;   // the Conv's, read once (bias zeros where it has none)
};

bool PadsNothing(const Node& conv) {
  const onnx::AttributeProto* auto_pad = conv.FindAttribute("auto_pad");
  if (auto_pad != nullptr && auto_pad->s() != "NOTSET" && auto_pad->s() != "VALID") return false;
  const onnx::AttributeProto* pads = conv.FindAttribute("pads");
  if (pads == nullptr) return true;
  for (int64_t pad : pads->ints()) {
    if (pad != 0) return false;
  }
  return true;
}

// A binary `op` reading a per-channel constant: the constant's values and the other operand.
std::optional<std::pair<std::vector<float>, std::string>> ChannelOperand(const Graph& graph, const Node* node,
                                                                         const char* op, int64_t channels, int rank) {
  if (node == nullptr || node->op_type() != op || !node->domain().empty() || node->input_size() != 2) {
    return std::nullopt;
  }
  for (int i = 0; i < 2; ++i) {
    const onnx::TensorProto* constant = ConstantTensor(graph, node->input(i));
    if (constant == nullptr) continue;
    std::optional<std::vector<float>> values = ChannelFloats(*constant, channels, rank);
    if (!values) return std::nullopt;
    return std::make_pair(*std::move(values), OtherInput(*node, i));
  }
  return std::nullopt;
}

MatchResult<InputAffine> MatchInputAffine(const Graph& graph, const ShapeInfo& shapes, Node* conv) {
  if (conv->op_type() != "Conv" || !conv->domain().empty() || conv->input_size() < 2) return Fail();
  const onnx::TensorProto* weight = ConstantTensor(graph, conv->input(1));
  if (weight == nullptr || weight->dims_size() < 3 || weight->data_type() != onnx::TensorProto::FLOAT) return Fail();
  const int64_t group = conv->GetAttributeInt("group", 1);
  const int64_t channels = weight->dims(1) * group;
  const int rank = weight->dims_size();
  InputAffine match;
  match.conv = conv;
  match.x = conv->input(0);
  match.scale.assign(static_cast<size_t>(channels), 1.0f);
  match.shift.assign(static_cast<size_t>(channels), 0.0f);
  // Backwards from the Conv: an Add, then a Mul (each optional), each read by the next node alone.
  Node* producer = graph.Producer(match.x);
  if (SoleConsumer(graph, match.x) != conv) return Fail();
  if (auto shift = ChannelOperand(graph, producer, "Add", channels, rank)) {
    match.add = producer;
    match.shift = std::move(shift->first);
    match.x = shift->second;
    producer = graph.Producer(match.x);
    if (SoleConsumer(graph, match.x) != match.add) producer = nullptr;
  }
  if (auto scale = ChannelOperand(graph, producer, "Mul", channels, rank)) {
    match.mul = producer;
    match.scale = std::move(scale->first);
    match.x = scale->second;
  }
  if (match.add == nullptr && match.mul == nullptr) return Fail();
  // The map must not broadcast x to another shape: x is already what the Conv reads, channels included.
  if (shapes.Rank(match.x) != rank || shapes.DimValue(match.x, 1) != channels) {
    return Fail("the input's rank or channels are not known to be the Conv's");
  }
  if (!PadsNothing(*conv)) return Fail("the Conv pads its input, so its border would read the map's shift");
  std::optional<std::vector<float>> w = TensorFloats(*weight);
  const bool has_bias = conv->input_size() > 2 && !conv->input(2).empty();
  std::optional<std::vector<float>> bias =
      has_bias ? ConstantFloats(graph, conv->input(2)) : std::vector<float>(static_cast<size_t>(weight->dims(0)), 0.0f);
  if (!w || !bias || static_cast<int64_t>(bias->size()) != weight->dims(0)) {
    return Fail("the Conv's weights or bias are not float constants it can rewrite");
  }
  match.weight = *std::move(w);
  match.bias = *std::move(bias);
  return match;
}

void Rewrite(Graph& graph, PassContext& context, InputAffine match) {
  Node* conv = match.conv;
  const onnx::TensorProto& weight = *ConstantTensor(graph, conv->input(1));
  std::vector<float>& w = match.weight;
  const int64_t outputs = weight.dims(0);
  const int64_t group_inputs = weight.dims(1);
  const int64_t per_output = static_cast<int64_t>(w.size()) / outputs;
  const int64_t kernel = per_output / group_inputs;
  const int64_t outputs_per_group = outputs / conv->GetAttributeInt("group", 1);
  const bool has_bias = conv->input_size() > 2 && !conv->input(2).empty();
  std::vector<float>& bias = match.bias;
  for (int64_t o = 0; o < outputs; ++o) {
    double shifted = 0.0;
    for (int64_t i = 0; i < group_inputs; ++i) {
      const size_t c = static_cast<size_t>(o / outputs_per_group * group_inputs + i);
      for (int64_t k = 0; k < kernel; ++k) {
        float& value = w[static_cast<size_t>(o * per_output + i * kernel + k)];
        shifted += static_cast<double>(value) * match.shift[c];
        value *= match.scale[c];
      }
    }
    bias[static_cast<size_t>(o)] += static_cast<float>(shifted);
  }
  onnx::NodeProto folded = conv->proto();
  folded.set_input(0, match.x);
  if (match.mul != nullptr) {
    const std::string name = graph.UniqueName(conv->input(1) + "_input_scaled");
    graph.AddInitializer(MakeFloatTensor(name, {weight.dims().begin(), weight.dims().end()}, w));
    folded.set_input(1, name);
  }
  const std::string bias_name = graph.UniqueName(absl::StrCat(conv->input(1), "_input_shifted_bias"));
  graph.AddInitializer(MakeFloatTensor(bias_name, {outputs}, bias));
  if (has_bias) {
    folded.set_input(2, bias_name);
  } else {
    folded.add_input(bias_name);
  }
  graph.AddNode(std::move(folded), conv, /*after=*/true);
  graph.RemoveNode(conv);
  if (match.add != nullptr) graph.RemoveNode(match.add);
  if (match.mul != nullptr) graph.RemoveNode(match.mul);
  context.CountRewrite();
}

class FoldAffineIntoConvPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fold_affine_into_conv"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fold a constant per-channel scale and shift of a Conv's input (Mul, Add) into the Conv's weights and "
           "bias where it pads nothing";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    RewriteEachMatch(
        graph, context, "fold_affine_into_conv: ", [&](Node* node) { return MatchInputAffine(graph, shapes, node); },
        [&](InputAffine match) { Rewrite(graph, context, std::move(match)); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFoldAffineIntoConvPass() { return std::make_unique<FoldAffineIntoConvPass>(); }

}  // namespace onnxopt
