// fuse_skip_layer_norm: a residual Add feeding LayerNormalization (or RMSNorm's
// SimplifiedLayerNormalization) becomes ONNX Runtime's SkipLayerNormalization (or
// SkipSimplifiedLayerNormalization), absorbing a constant bias Add on one branch when there is one.
//
// Before:  s = Add(input, skip); Y = LayerNormalization(s, gamma, [beta], axis=-1, epsilon)
// After:   Y = com.microsoft::SkipLayerNormalization(input, skip, gamma, [beta], [bias], epsilon)
//          (SkipSimplifiedLayerNormalization(input, skip, gamma, [bias], epsilon) for RMSNorm)
// Bias:    input = Add(h, bias[N]) read only here  ->  SkipLayerNormalization(h, skip, gamma, beta, bias)
// Sum:     when s is read elsewhere too (pre-norm models: GPT-2, ViT keep the residual stream),
//          those readers take SkipLayerNormalization's 4th output, input + skip + bias.
// Needs the input known (shape inference) to be [B,S,H] and the skip [B,S,H], [1,S,H] or [S,H]
// (ONNX Runtime broadcasts those), or both [B,H]; gamma and beta (if any) 1-D constants of H, normalization
// over the last axis (run after fuse_layer_norm).
#include "optimizer/passes/match.h"
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

struct SkipNormMatch {
  Node* norm = nullptr;
  Node* add = nullptr;
  Node* bias_add = nullptr;   // absorbed, when there is one
  std::string input, skip, bias;
  bool simplified = false;
  bool sum_read_elsewhere = false;
};

// The constant [H] operand of an Add on one residual branch that is full [B,S,H] and read only here.
std::optional<int> BiasOf(const Graph& graph, const ShapeInfo& shapes, const Node& candidate, const Node& add,
                          int64_t width) {
  if (graph.Consumers(candidate.output(0)).size() != 1 || graph.IsGraphOutput(candidate.output(0)) ||
      !shapes.SameShape(candidate.output(0), add.output(0))) {
    return std::nullopt;
  }
  return FindOperand(candidate, [&](const std::string& operand) {
    const onnx::TensorProto* constant = ConstantTensor(graph, operand);
    const int index = candidate.input(0) == operand ? 0 : 1;
    return constant != nullptr && constant->dims_size() == 1 && constant->dims(0) == width &&
           shapes.SameShape(OtherInput(candidate, index), add.output(0));
  });
}

// Anchored at the normalization.
MatchResult<SkipNormMatch> MatchSkipNorm(const Graph& graph, Node* norm, const ShapeInfo& shapes) {
  SkipNormMatch match;
  match.norm = norm;
  match.simplified = norm->op_type() == "SimplifiedLayerNormalization";
  if (!norm->domain().empty() || (norm->op_type() != "LayerNormalization" && !match.simplified)) return Fail();
  // LayerNormalization with or without its beta (ModernBERT's norms have none, and SkipLayerNormalization's
  // beta is optional too); neither may use its mean/inv-std outputs.
  if (norm->input_size() != 2 && (match.simplified || norm->input_size() != 3)) return Fail();
  if (norm->output_size() != 1) return Fail();
  match.add = ProducerWithOp(graph, norm->input(0), "Add");
  if (match.add == nullptr || match.add->input_size() != 2) return Fail();
  const int64_t axis = norm->GetAttributeInt("axis", -1);
  if (axis != -1 && axis != 2) return Fail();
  // The full [B,S,H] operand is the input; the other may broadcast.
  const Node& add = *match.add;
  const std::optional<int> full = FindOperand(add, [&](const std::string& operand) {
    const auto rank = shapes.Rank(operand);
    const std::string& other = add.input(0) == operand ? add.input(1) : add.input(0);
    return rank && (*rank == 3 || (*rank == 2 && shapes.SameShape(add.input(0), add.input(1)))) &&
           shapes.SameShape(operand, add.output(0)) && SkipShapeFits(shapes, operand, other);
  });
  if (!full) {
    return Fail("fuse_skip_layer_norm: residual inputs are not known to be [B,S,H] and a skip ONNX Runtime broadcasts");
  }
  match.input = add.input(*full);
  match.skip = OtherInput(add, *full);
  if (match.input == match.skip) return Fail();  // Add(y, y): one value cannot be both
  const onnx::TensorProto* gamma = ConstantTensor(graph, norm->input(1));
  const bool has_beta = !match.simplified && norm->input_size() > 2 && !norm->input(2).empty();
  const onnx::TensorProto* beta = has_beta ? ConstantTensor(graph, norm->input(2)) : gamma;  // gamma: no beta to check
  const auto width = shapes.DimValue(match.input, -1);
  if (gamma == nullptr || beta == nullptr || gamma->dims_size() != 1 || beta->dims_size() != 1 || !width ||
      gamma->dims(0) != *width || beta->dims(0) != *width) {
    return Fail();
  }
  // Other readers of the sum take output 3.
  match.sum_read_elsewhere = graph.Consumers(add.output(0)).size() > 1 || graph.IsGraphOutput(add.output(0));
  for (const std::string& operand : {match.input, match.skip}) {
    Node* candidate = ProducerWithOp(graph, operand, "Add");
    if (candidate == nullptr) continue;
    const std::optional<int> bias = BiasOf(graph, shapes, *candidate, add, gamma->dims(0));
    if (!bias) continue;
    // The biased operand is the full one: it becomes the input, the other the skip.
    match.skip = operand == match.input ? match.skip : match.input;
    match.bias = candidate->input(*bias);
    match.input = OtherInput(*candidate, *bias);
    match.bias_add = candidate;
    break;
  }
  return match;
}

void Rewrite(Graph& graph, const SkipNormMatch& match, PassContext& context) {
  Node* norm = match.norm;
  std::vector<std::string> inputs = {match.input, match.skip, norm->input(1)};
  const std::string beta = norm->input_size() > 2 ? norm->input(2) : "";
  if (!match.simplified && (!beta.empty() || !match.bias.empty())) inputs.push_back(beta);
  if (!match.bias.empty()) inputs.push_back(match.bias);
  std::vector<std::string> outputs = {norm->output(0)};
  if (match.sum_read_elsewhere) outputs.insert(outputs.end(), {"", "", match.add->output(0)});  // mean, inv_std_var
  const char* op = match.simplified ? "SkipSimplifiedLayerNormalization" : "SkipLayerNormalization";
  onnx::NodeProto fused = MakeNode(op, graph.UniqueName(match.simplified ? "SkipRMSNorm" : "SkipLayerNorm"),
                                   std::move(inputs), std::move(outputs), "com.microsoft");
  *fused.add_attribute() = MakeFloatAttribute("epsilon", norm->GetAttributeFloat("epsilon", 1e-5f));
  graph.RemoveNode(norm);
  graph.RemoveNode(match.add);
  if (match.bias_add != nullptr) graph.RemoveNode(match.bias_add);
  graph.AddNode(std::move(fused), norm, /*after=*/true);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
}

class FuseSkipLayerNormPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fuse_skip_layer_norm"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fuse a residual Add (and a bias Add) with LayerNormalization or RMSNorm into (Simplified)SkipLayerNormalization";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    RewriteEachMatch(
        graph, context, "", [&](Node* norm) { return MatchSkipNorm(graph, norm, shapes); },
        [&](const SkipNormMatch& match) { Rewrite(graph, match, context); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseSkipLayerNormPass() { return std::make_unique<FuseSkipLayerNormPass>(); }

}  // namespace onnxopt
