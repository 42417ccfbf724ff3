// fuse_layer_norm: the decomposed LayerNorm and RMSNorm exporters write become one normalization.
//
// Before:  mean = ReduceMean(X, axes=[-1]); d = Sub(X, mean); v = ReduceMean(Pow(d, 2) | Mul(d, d));
//          n = d / sqrt(v + eps);  Y = Add(Mul(n, gamma), beta)
// After:   Y = LayerNormalization(X, gamma, beta, axis=-1, epsilon=eps)
// Before:  v = ReduceMean(Pow(X, 2) | Mul(X, X)); n = X / sqrt(v + eps); Y = Mul(n, gamma)   (RMSNorm:
//          T5, LLaMA)
// After:   Y = SimplifiedLayerNormalization(X, gamma, axis=-1, epsilon=eps)
// Before (TensorFlow's batch_normalization, tf2onnx and keras2onnx): inv = Reciprocal(Sqrt(v + eps)) * gamma;
//          Y = Add(Mul(X, inv), Sub(beta, Mul(mean, inv)))
// The division may be written Div(d, Sqrt(s)), Mul(d, Reciprocal(Sqrt(s))), Mul(d, Div(1, Sqrt(s))),
// with Pow(s, 0.5) for Sqrt, or Mul(d, Pow(s, -0.5)); eps may come first in its Add; Mul and Add
// operands in either order; gamma and beta optional (a missing gamma becomes ones when the last dim
// is static). An unfused LayerNormalization followed by a constant bias Add takes it as its beta.
// Checked before rewriting: both reductions over the last axis only (keepdims), the exponents, eps
// a scalar constant, gamma/beta 1-D float constants, and no intermediate value read outside the
// pattern. LayerNormalization is standard from opset 17; below that it and SimplifiedLayerNormalization
// are ONNX Runtime's (same name, ONNX domain), which the report's runtimes say.
#include <cmath>

#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// The other input of a binary node, given one.
std::string Other(const Node& node, const std::string& one) { return node.input(0) == one ? node.input(1) : node.input(0); }

bool ReducesLastAxis(const Node& node, const Graph& graph, int64_t opset, int rank) {
  if (node.op_type() != "ReduceMean" || !node.domain().empty() || node.GetAttributeInt("keepdims", 1) != 1) return false;
  std::optional<std::vector<int64_t>> axes;
  if (opset >= 18) {
    if (node.input_size() < 2) return false;
    axes = ConstantInts(graph, node.input(1));
  } else if (const onnx::AttributeProto* attribute = node.FindAttribute("axes")) {
    axes = std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
  }
  return axes && axes->size() == 1 && ((*axes)[0] == -1 || (rank > 0 && (*axes)[0] == rank - 1));
}

bool IsConstant(const Graph& graph, const std::string& value, double expected) {
  return IsScalarNear(graph, value, expected, 1e-6 * std::max(1.0, std::fabs(expected)));
}

// The value squared: Pow(d, 2) or Mul(d, d).
std::optional<std::string> Squared(const Graph& graph, const Node* node) {
  if (node == nullptr || !node->domain().empty() || node->input_size() != 2) return std::nullopt;
  if (node->op_type() == "Pow" && IsConstant(graph, node->input(1), 2.0)) return node->input(0);
  if (node->op_type() == "Mul" && node->input(0) == node->input(1)) return node->input(0);
  return std::nullopt;
}

// A float constant [H] for the normalized width H (the kernels take no broadcasting scale or bias);
// with H unknown, any width but 1.
bool IsWidthConstant(const Graph& graph, const std::string& value, std::optional<int64_t> width) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  return tensor != nullptr && tensor->dims_size() == 1 && tensor->data_type() == onnx::TensorProto::FLOAT &&
         (width ? tensor->dims(0) == *width : tensor->dims(0) > 1);
}

// From s = v + eps to the normalized value n = d / sqrt(s); the nodes on the way go into `pattern`.
std::optional<std::string> MatchDivision(const Graph& graph, const std::string& s, const std::string& d,
                                         std::vector<Node*>* pattern) {
  Node* next = SoleConsumer(graph, s);
  if (next == nullptr || !next->domain().empty() || next->input(0) != s) return std::nullopt;
  auto finish_mul = [&](Node* factor_node) -> std::optional<std::string> {
    Node* mul = SoleConsumer(graph, factor_node->output(0));
    if (mul == nullptr || mul->op_type() != "Mul" || !mul->domain().empty() ||
        Other(*mul, factor_node->output(0)) != d) {
      return std::nullopt;
    }
    pattern->insert(pattern->end(), {factor_node, mul});
    return mul->output(0);
  };
  if (next->op_type() == "Pow" && IsConstant(graph, next->input(1), -0.5)) return finish_mul(next);  // rsqrt
  const bool root = next->op_type() == "Sqrt" || (next->op_type() == "Pow" && IsConstant(graph, next->input(1), 0.5));
  if (!root) return std::nullopt;
  pattern->push_back(next);
  const std::string& sqrt = next->output(0);
  Node* after = SoleConsumer(graph, sqrt);
  if (after == nullptr || !after->domain().empty()) return std::nullopt;
  if (after->op_type() == "Div" && after->input(1) == sqrt && after->input(0) == d) {
    pattern->push_back(after);
    return after->output(0);
  }
  if (after->op_type() == "Reciprocal" ||
      (after->op_type() == "Div" && after->input(1) == sqrt && IsConstant(graph, after->input(0), 1.0))) {
    return finish_mul(after);
  }
  return std::nullopt;
}

// 1 / sqrt(s): Reciprocal(Sqrt(s)), Div(1, Sqrt(s)) (Sqrt as Pow(s, 0.5) too), or Pow(s, -0.5); its nodes
// go into `pattern`.
std::optional<std::string> InverseRoot(const Graph& graph, const std::string& s, std::vector<Node*>* pattern) {
  Node* next = SoleConsumer(graph, s);
  if (next == nullptr || !next->domain().empty() || next->input(0) != s) return std::nullopt;
  if (next->op_type() == "Pow" && IsConstant(graph, next->input(1), -0.5)) {
    pattern->push_back(next);
    return next->output(0);
  }
  if (!(next->op_type() == "Sqrt" || (next->op_type() == "Pow" && IsConstant(graph, next->input(1), 0.5)))) {
    return std::nullopt;
  }
  Node* after = SoleConsumer(graph, next->output(0));
  if (after == nullptr || !after->domain().empty() ||
      !(after->op_type() == "Reciprocal" ||
        (after->op_type() == "Div" && after->input(1) == next->output(0) && IsConstant(graph, after->input(0), 1.0)))) {
    return std::nullopt;
  }
  pattern->insert(pattern->end(), {next, after});
  return after->output(0);
}

// One decomposed normalization: its nodes, input, output and parameters.
struct NormMatch {
  std::vector<Node*> pattern;
  std::string x, output, gamma, beta;  // gamma empty: ones to be made, of `width`
  bool simplified = true;              // RMSNorm
  float epsilon = 0;
  int64_t width = 0;
};

// TensorFlow's form from s = var + eps: inv = 1 / sqrt(s) [* gamma]; Y = Add(Mul(x, inv), Sub(beta, Mul(mean,
// inv))), operands of Mul and Add in either order. `match` holds x and the mean's nodes (pattern[2] is the
// mean's ReduceMean); fills gamma, beta, output and the pattern.
MatchResult<Matched> MatchTensorflowForm(const Graph& graph, const std::string& s, std::optional<int64_t> width,
                                         NormMatch* match) {
  const std::optional<std::string> inverse = InverseRoot(graph, s, &match->pattern);
  if (!inverse) return Fail("fuse_layer_norm: the variance is not turned into a division by its square root");
  const std::string& mean = match->pattern[2]->output(0);
  std::string inv = *inverse;
  if (Node* scale = SoleConsumer(graph, inv); scale != nullptr && scale->op_type() == "Mul" &&
                                               IsWidthConstant(graph, Other(*scale, inv), width)) {
    match->gamma = Other(*scale, inv);
    match->pattern.push_back(scale);
    inv = scale->output(0);
  }
  Node *scaled_x = nullptr, *scaled_mean = nullptr;
  for (Node* reader : graph.Consumers(inv)) {
    if (reader->op_type() != "Mul" || !reader->domain().empty() || reader->input_size() != 2) continue;
    if (Other(*reader, inv) == match->x) scaled_x = reader;
    if (Other(*reader, inv) == mean) scaled_mean = reader;
  }
  if (scaled_x == nullptr || scaled_mean == nullptr) {
    return Fail("fuse_layer_norm: the inverse root does not scale both the input and its mean");
  }
  Node* shift = SoleConsumer(graph, scaled_mean->output(0));
  Node* sum = SoleConsumer(graph, scaled_x->output(0));
  if (shift == nullptr || shift->op_type() != "Sub" || shift->input(1) != scaled_mean->output(0) ||
      !IsWidthConstant(graph, shift->input(0), width) || sum == nullptr || sum->op_type() != "Add" ||
      Other(*sum, scaled_x->output(0)) != shift->output(0)) {
    return Fail("fuse_layer_norm: not x * inv + (beta - mean * inv)");
  }
  match->beta = shift->input(0);
  match->pattern.insert(match->pattern.end(), {scaled_x, scaled_mean, shift, sum});
  match->output = sum->output(0);
  if (match->gamma.empty()) {
    if (!width || *width <= 0) return Fail("fuse_layer_norm: no constant scale and the last dim is not static");
    match->width = *width;
  }
  return Matched{};
}

// Anchored at the variance's ReduceMean.
MatchResult<NormMatch> MatchNorm(const Graph& graph, Node* variance, int64_t opset, const ShapeInfo& shapes) {
  if (variance->op_type() != "ReduceMean" || !variance->domain().empty()) return Fail();
  Node* square = graph.Producer(variance->input(0));
  const std::optional<std::string> d = Squared(graph, square);
  if (!d) return Fail();
  const int rank = shapes.Rank(*d).value_or(0);
  if (!ReducesLastAxis(*variance, graph, opset, rank)) return Fail();
  // LayerNorm when d = X - mean(X); RMSNorm when d is X itself.
  NormMatch match;
  match.pattern = {square, variance};
  match.x = *d;
  if (Node* sub = ProducerWithOp(graph, *d, "Sub")) {
    Node* mean = graph.Producer(sub->input(1));
    if (mean != nullptr && mean->input(0) == sub->input(0) && ReducesLastAxis(*mean, graph, opset, rank)) {
      match.x = sub->input(0);
      match.simplified = false;
      match.pattern.insert(match.pattern.end(), {mean, sub});
    }
  }
  Node* add_eps = SoleConsumer(graph, variance->output(0));
  auto epsilon = add_eps != nullptr && add_eps->op_type() == "Add" && add_eps->domain().empty()
                     ? ConstantScalarFloat(graph, Other(*add_eps, variance->output(0)))
                     : std::nullopt;
  if (!epsilon) return Fail("fuse_layer_norm: epsilon is not a scalar constant added to the variance");
  match.epsilon = *epsilon;
  match.pattern.push_back(add_eps);
  const std::optional<int64_t> width = shapes.DimValue(match.x, -1);
  std::optional<std::string> normalized = MatchDivision(graph, add_eps->output(0), *d, &match.pattern);
  if (!normalized && !match.simplified) {
    // TensorFlow's batch_normalization spelling (tf2onnx, keras2onnx): the scale folded into the inverse
    // root before it meets x and the mean.
    if (MatchResult<Matched> tensorflow = MatchTensorflowForm(graph, add_eps->output(0), width, &match); !tensorflow) {
      return tensorflow.failure();
    }
    if (!OnlyPatternReads(graph, match.pattern, match.output)) {
      return Fail("fuse_layer_norm: an intermediate value is read outside the pattern");
    }
    return match;
  }
  if (!normalized) return Fail("fuse_layer_norm: the variance is not turned into a division by its square root");
  // Optional scale and (LayerNorm only) shift.
  match.output = *normalized;
  if (Node* scale = SoleConsumer(graph, match.output); scale != nullptr && scale->op_type() == "Mul" &&
                                                        IsWidthConstant(graph, Other(*scale, match.output), width)) {
    match.gamma = Other(*scale, match.output);
    match.pattern.push_back(scale);
    match.output = scale->output(0);
  }
  if (Node* shift = SoleConsumer(graph, match.output); !match.simplified && shift != nullptr &&
                                                        shift->op_type() == "Add" &&
                                                        IsWidthConstant(graph, Other(*shift, match.output), width)) {
    match.beta = Other(*shift, match.output);
    match.pattern.push_back(shift);
    match.output = shift->output(0);
  }
  if (match.gamma.empty()) {
    if (!width || *width <= 0) return Fail("fuse_layer_norm: no constant scale and the last dim is not static");
    match.width = *width;
  }
  if (!OnlyPatternReads(graph, match.pattern, match.output)) {
    return Fail("fuse_layer_norm: an intermediate value is read outside the pattern");
  }
  return match;
}

void Rewrite(Graph& graph, NormMatch match, PassContext& context) {
  if (match.gamma.empty()) {
    match.gamma = graph.UniqueName("layer_norm_ones");
    graph.AddInitializer(
        MakeFloatTensor(match.gamma, {match.width}, std::vector<float>(static_cast<size_t>(match.width), 1.0f)));
  }
  std::vector<std::string> inputs = {match.x, match.gamma};
  if (!match.beta.empty()) inputs.push_back(match.beta);
  const char* op = match.simplified ? "SimplifiedLayerNormalization" : "LayerNormalization";
  onnx::NodeProto fused =
      MakeNode(op, graph.UniqueName(match.simplified ? "RMSNorm" : "LayerNorm"), std::move(inputs), {match.output});
  *fused.add_attribute() = MakeIntAttribute("axis", -1);
  *fused.add_attribute() = MakeFloatAttribute("epsilon", match.epsilon);
  Node* anchor = match.pattern.back();
  for (Node* node : match.pattern) graph.RemoveNode(node);
  graph.AddNode(std::move(fused), anchor, /*after=*/true);
  context.CountRewrite();
}

// LayerNormalization(X, gamma) whose only reader adds a constant [H] takes it as its beta.
void AbsorbBias(Graph& graph, PassContext& context) {
  for (Node* norm : graph.Nodes()) {
    if (norm->removed() || norm->op_type() != "LayerNormalization" || !norm->domain().empty() ||
        norm->input_size() != 2 || norm->output_size() != 1) {
      continue;
    }
    Node* shift = SoleConsumer(graph, norm->output(0));
    if (shift == nullptr || shift->op_type() != "Add" || !shift->domain().empty()) continue;
    const std::string beta = Other(*shift, norm->output(0));
    const onnx::TensorProto* gamma = ConstantTensor(graph, norm->input(1));
    const onnx::TensorProto* bias = ConstantTensor(graph, beta);
    if (gamma == nullptr || bias == nullptr || bias->data_type() != gamma->data_type() || bias->dims_size() != 1 ||
        gamma->dims_size() != 1 || bias->dims(0) != gamma->dims(0)) {
      continue;
    }
    onnx::NodeProto fused = norm->proto();
    fused.add_input(beta);
    fused.set_output(0, shift->output(0));
    graph.RemoveNode(shift);
    graph.RemoveNode(norm);
    graph.AddNode(std::move(fused), norm, /*after=*/true);
    context.CountRewrite();
  }
}

class FuseLayerNormPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fuse_layer_norm"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fuse decomposed LayerNorm into LayerNormalization and RMSNorm into SimplifiedLayerNormalization";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    const int64_t opset = context.OpsetVersion("");
    RewriteEachMatch(
        graph, context, "", [&](Node* variance) { return MatchNorm(graph, variance, opset, shapes); },
        [&](NormMatch match) { Rewrite(graph, std::move(match), context); });
    AbsorbBias(graph, context);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseLayerNormPass() { return std::make_unique<FuseLayerNormPass>(); }

}  // namespace onnxopt
