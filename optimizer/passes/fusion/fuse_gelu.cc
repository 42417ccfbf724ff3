// fuse_gelu: the Gelu family, as exporters write it, becomes ONNX Runtime's fused operators.
//
// Before (erf):   y = x * 0.5 * (1 + Erf(x / sqrt(2)))                    After:  y = Gelu(x)
// Before (tanh):  y = 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))      y = FastGelu(x)
//                  (the argument in any spelling of that polynomial: x * 0.79788 * (1 + 0.044715 * x * x)
//                  as Hugging Face's FastGELU and Megatron write it, constants folded, polynomial.h)
// Before (quick): y = x * Sigmoid(alpha * x), or SiLU x * Sigmoid(x)              y = QuickGelu(x, alpha)
// With x = Add(h, bias[N]) read by nothing else, the bias is absorbed: BiasGelu(h, bias) and
// FastGelu(h, bias), also for a Gelu/FastGelu fused earlier whose bias Add appeared later and for
// ONNX's Gelu (opset 20; approximate "tanh" as FastGelu) after a bias Add. Operands
// of Mul/Add may come in either order; the arguments of Erf and Tanh are matched as polynomials of x
// (x / sqrt(2) or x * 0.7071; x^3 as Pow or x * x * x). Constants must match to 1e-4 relative. All emitted operators are in
// com.microsoft: the result runs on ONNX Runtime.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/polynomial.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

constexpr char kMicrosoft[] = "com.microsoft";

// The other operand of a binary `op` whose one operand is a constant within 1e-4 (relative) of `expected`.
std::optional<std::string> BesideConstant(const Graph& graph, const Node* node, const char* op, double expected) {
  return OperandBesideScalar(graph, node, op, expected, 1e-4 * std::fabs(expected));
}

// What one Gelu form matched: its nodes, input and output, and the operator it becomes.
struct GeluMatch {
  std::vector<Node*> nodes;
  std::string x, output;
  const char* op = "";
  float alpha = 0;  // QuickGelu
};

// The tail `x * 0.5 * one_plus` (any grouping of the three factors, x = match.x): its nodes and output.
MatchResult<GeluMatch> MatchHalfProductTail(const Graph& graph, const std::string& one_plus, GeluMatch match) {
  const std::string x = match.x;
  Node* consumer = SoleConsumer(graph, one_plus);
  if (consumer == nullptr || consumer->op_type() != "Mul" || consumer->input_size() != 2) return Fail();
  auto finish = [&](Node* first, Node* last) -> MatchResult<GeluMatch> {
    match.nodes.insert(match.nodes.end(), {first, last});
    match.output = last->output(0);
    return match;
  };
  // (x * one_plus) * 0.5
  if (IsMulOf(consumer, x, one_plus)) {
    Node* half = SoleConsumer(graph, consumer->output(0));
    if (!BesideConstant(graph, half, "Mul", 0.5)) return Fail();
    return finish(consumer, half);
  }
  // (x * 0.5) * one_plus, or (0.5 * one_plus) * x
  const std::string& other = consumer->input(0) == one_plus ? consumer->input(1) : consumer->input(0);
  Node* other_node = graph.Producer(other);
  if (auto base = BesideConstant(graph, other_node, "Mul", 0.5); base && *base == x) return finish(other_node, consumer);
  if (auto half = ConstantScalarFloat(graph, other); half && std::fabs(*half - 0.5) <= 1e-4 * 0.5) {
    Node* last = SoleConsumer(graph, consumer->output(0));
    if (!IsMulOf(last, consumer->output(0), x)) return Fail();
    return finish(consumer, last);
  }
  return Fail();
}

// Erf form, anchored at the Erf: erf(x / sqrt(2)), its argument in any spelling of 0.7071 x.
MatchResult<GeluMatch> MatchErfGelu(const Graph& graph, Node* erf) {
  std::optional<Polynomial> argument = PolynomialOf(graph, erf->input(0));
  if (!argument || !argument->Is({{1, 1.0 / std::sqrt(2.0)}}, 1e-4)) return Fail();
  GeluMatch match;
  match.x = argument->variable;
  match.op = "Gelu";
  Node* one_plus = SoleConsumer(graph, erf->output(0));
  if (!BesideConstant(graph, one_plus, "Add", 1.0)) return Fail();
  match.nodes = argument->nodes;
  match.nodes.insert(match.nodes.end(), {erf, one_plus});
  return MatchHalfProductTail(graph, one_plus->output(0), std::move(match));
}

// Tanh form, anchored at the Tanh: its argument is sqrt(2/pi) (x + 0.044715 x^3) in whatever spelling
// (polynomial.h: the textbook form with Pow or x*x*x, Hugging Face's and Megatron's
// x * 0.79788 * (1 + 0.044715 * x * x), their constants folded).
MatchResult<GeluMatch> MatchTanhGelu(const Graph& graph, Node* tanh) {
  const double sqrt_two_over_pi = std::sqrt(2.0 / M_PI);
  std::optional<Polynomial> argument = PolynomialOf(graph, tanh->input(0));
  if (!argument || !argument->Is({{1, sqrt_two_over_pi}, {3, sqrt_two_over_pi * 0.044715}}, 1e-4)) return Fail();
  GeluMatch match;
  match.x = argument->variable;
  match.op = "FastGelu";
  match.nodes = argument->nodes;
  match.nodes.push_back(tanh);
  Node* one_plus = SoleConsumer(graph, tanh->output(0));
  if (!BesideConstant(graph, one_plus, "Add", 1.0)) return Fail();
  match.nodes.push_back(one_plus);
  return MatchHalfProductTail(graph, one_plus->output(0), std::move(match));
}

// Sigmoid form, anchored at the Sigmoid: x * Sigmoid(alpha * x), or SiLU x * Sigmoid(x).
MatchResult<GeluMatch> MatchQuickGelu(const Graph& graph, Node* sigmoid) {
  GeluMatch match;
  match.op = "QuickGelu";
  Node* scale = ProducerWithOp(graph, sigmoid->input(0), "Mul");
  if (scale != nullptr) {
    const std::optional<int> constant =
        FindOperand(*scale, [&](const std::string& operand) { return ConstantScalarFloat(graph, operand).has_value(); });
    if (constant) {
      match.alpha = *ConstantScalarFloat(graph, scale->input(*constant));
      match.x = OtherInput(*scale, *constant);
    }
  }
  Node* product = SoleConsumer(graph, sigmoid->output(0));
  if (!match.x.empty() && IsMulOf(product, match.x, sigmoid->output(0))) {
    match.nodes = {scale, sigmoid, product};
  } else if (IsMulOf(product, sigmoid->input(0), sigmoid->output(0))) {
    match.x = sigmoid->input(0);
    match.alpha = 1.0f;
    match.nodes = {sigmoid, product};
  } else {
    return Fail();
  }
  match.output = product->output(0);
  return match;
}

MatchResult<GeluMatch> MatchGelu(const Graph& graph, Node* node) {
  if (node->op_type() == "Erf") return MatchErfGelu(graph, node);
  if (node->op_type() == "Tanh") return MatchTanhGelu(graph, node);
  if (node->op_type() == "Sigmoid") return MatchQuickGelu(graph, node);
  return Fail();
}

// The constant 1-D float operand of `add` (a bias), if it has one.
std::optional<int> BiasOperand(const Graph& graph, const Node& add) {
  return FindOperand(add, [&](const std::string& operand) {
    const onnx::TensorProto* constant = ConstantTensor(graph, operand);
    return constant != nullptr && constant->dims_size() == 1 && constant->data_type() == onnx::TensorProto::FLOAT;
  });
}

void FuseOne(Graph& graph, PassContext& context, const GeluMatch& match) {
  // Absorb a constant bias: x = Add(h, bias[N]) read only by this pattern.
  std::string input = match.x, bias;
  Node* bias_add = ProducerWithOp(graph, match.x, "Add");
  if (std::string(match.op) != "QuickGelu" && bias_add != nullptr && !graph.IsGraphOutput(match.x)) {
    bool only_pattern = true;
    for (Node* consumer : graph.Consumers(match.x)) {
      only_pattern &= std::find(match.nodes.begin(), match.nodes.end(), consumer) != match.nodes.end();
    }
    if (std::optional<int> side = only_pattern ? BiasOperand(graph, *bias_add) : std::nullopt) {
      bias = bias_add->input(*side);
      input = OtherInput(*bias_add, *side);
    }
  }
  const std::string op = std::string(match.op) == "Gelu" && !bias.empty() ? "BiasGelu" : match.op;
  std::vector<std::string> inputs = {input};
  if (!bias.empty()) inputs.push_back(bias);
  onnx::NodeProto fused = MakeNode(op, graph.UniqueName(op), std::move(inputs), {match.output}, kMicrosoft);
  if (op == "QuickGelu") *fused.add_attribute() = MakeFloatAttribute("alpha", match.alpha);
  Node* anchor = match.nodes.back();
  for (Node* n : match.nodes) graph.RemoveNode(n);
  if (!bias.empty()) graph.RemoveNode(bias_add);
  graph.AddNode(std::move(fused), anchor, /*after=*/true);
  context.RequireOpset(kMicrosoft, 1);
  context.CountRewrite();
}

// Gelu(Add(h, bias)) -> BiasGelu(h, bias); FastGelu(Add(h, bias)) -> FastGelu(h, bias), for Gelu nodes
// fused before their bias Add became visible (an earlier rewrite produced it), and for ONNX's own
// Gelu (opset 20, what the dynamo exporter writes): approximate "none" as BiasGelu, "tanh" as FastGelu.
void AbsorbBiasIntoFusedGelu(Graph& graph, PassContext& context) {
  for (Node* gelu : graph.Nodes()) {
    const bool onnx_gelu = gelu->domain().empty() && gelu->op_type() == "Gelu";
    if (gelu->removed() || gelu->input_size() != 1 ||
        !(onnx_gelu || (gelu->domain() == kMicrosoft && (gelu->op_type() == "Gelu" || gelu->op_type() == "FastGelu")))) {
      continue;
    }
    std::string approximate = "none";
    if (const onnx::AttributeProto* attribute = gelu->FindAttribute("approximate"); onnx_gelu && attribute != nullptr) {
      approximate = attribute->s();
    }
    if (approximate != "none" && approximate != "tanh") continue;
    Node* add = ProducerWithOp(graph, gelu->input(0), "Add");
    if (add == nullptr || SoleConsumer(graph, add->output(0)) != gelu) continue;
    const std::optional<int> side = BiasOperand(graph, *add);
    if (!side) continue;
    onnx::NodeProto fused = gelu->proto();
    if (onnx_gelu) {
      fused.set_domain(kMicrosoft);
      fused.clear_attribute();
      if (approximate == "tanh") fused.set_op_type("FastGelu");
      context.RequireOpset(kMicrosoft, 1);
    }
    if (fused.op_type() == "Gelu") fused.set_op_type("BiasGelu");
    fused.set_input(0, OtherInput(*add, *side));
    fused.add_input(add->input(*side));
    graph.RemoveNode(add);
    graph.RemoveNode(gelu);
    graph.AddNode(std::move(fused), gelu, /*after=*/true);
    context.CountRewrite();
  }
}

class FuseGeluPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_gelu"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fuse the Gelu family (erf, tanh and sigmoid forms, with a bias Add) into ONNX Runtime's Gelu, "
           "FastGelu, QuickGelu and BiasGelu";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* node : graph.Nodes()) {
      if (node->removed() || !node->domain().empty()) continue;
      MatchResult<GeluMatch> match = MatchGelu(graph, node);
      if (!match) continue;
      // Intermediate values stay inside.
      if (!OnlyPatternReads(graph, match->nodes, match->output)) {
        context.Skip(absl::StrCat("fuse_gelu: an intermediate value of the ", match->op, " pattern is read elsewhere"));
        continue;
      }
      FuseOne(graph, context, *match);
    }
    AbsorbBiasIntoFusedGelu(graph, context);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseGeluPass() { return std::make_unique<FuseGeluPass>(); }

}  // namespace onnxopt
