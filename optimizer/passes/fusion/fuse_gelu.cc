// fuse_gelu: the Gelu family, as exporters write it, becomes ONNX Runtime's fused operators.
//
// Before (erf):   y = x * 0.5 * (1 + Erf(x / sqrt(2)))                    After:  y = Gelu(x)
// Before (tanh):  y = 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))      y = FastGelu(x)
// Before (quick): y = x * Sigmoid(alpha * x), or SiLU x * Sigmoid(x)              y = QuickGelu(x, alpha)
// With x = Add(h, bias[N]) read by nothing else, the bias is absorbed: BiasGelu(h, bias) and
// FastGelu(h, bias), also for a Gelu/FastGelu fused earlier whose bias Add appeared later and for
// ONNX's Gelu (opset 20; approximate "tanh" as FastGelu) after a bias Add. Operands
// of Mul/Add may come in either order; x / sqrt(2) may be written x * (1 / sqrt(2)); x^3 as Pow or
// x * x * x. Constants must match to 1e-4 relative. All emitted operators are in
// com.microsoft: the result runs on ONNX Runtime.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

constexpr char kMicrosoft[] = "com.microsoft";

bool Near(float value, double expected) { return std::fabs(value - expected) <= 1e-4 * std::fabs(expected); }

// For a binary `op` node with one constant operand near `expected`, the other operand.
std::optional<std::string> WithConstant(const Graph& graph, const Node* node, const char* op, double expected) {
  if (node == nullptr || node->op_type() != op || !node->domain().empty() || node->input_size() != 2) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    auto value = ConstantScalarFloat(graph, node->input(side));
    if (value && Near(*value, expected)) return node->input(1 - side);
  }
  return std::nullopt;
}

bool IsMulOf(const Node* node, const std::string& a, const std::string& b) {
  return node != nullptr && node->op_type() == "Mul" && node->domain().empty() && node->input_size() == 2 &&
         ((node->input(0) == a && node->input(1) == b) || (node->input(0) == b && node->input(1) == a));
}

// The tail `x * 0.5 * one_plus` (any grouping of the three factors); returns the nodes and the output.
bool MatchHalfProductTail(const Graph& graph, const std::string& x, const std::string& one_plus,
                          std::vector<Node*>* nodes, std::string* output) {
  Node* consumer = SoleConsumer(graph, one_plus);
  if (consumer == nullptr) return false;
  // (x * one_plus) * 0.5
  if (IsMulOf(consumer, x, one_plus)) {
    Node* half = SoleConsumer(graph, consumer->output(0));
    if (!WithConstant(graph, half, "Mul", 0.5)) return false;
    nodes->insert(nodes->end(), {consumer, half});
    *output = half->output(0);
    return true;
  }
  // (x * 0.5) * one_plus, or (0.5 * one_plus) * x
  if (consumer->op_type() != "Mul" || consumer->input_size() != 2) return false;
  const std::string other = consumer->input(0) == one_plus ? consumer->input(1) : consumer->input(0);
  Node* other_node = graph.Producer(other);
  if (auto base = WithConstant(graph, other_node, "Mul", 0.5); base && *base == x) {
    nodes->insert(nodes->end(), {other_node, consumer});
    *output = consumer->output(0);
    return true;
  }
  if (ConstantScalarFloat(graph, other) && Near(*ConstantScalarFloat(graph, other), 0.5)) {
    Node* last = SoleConsumer(graph, consumer->output(0));
    if (!IsMulOf(last, consumer->output(0), x)) return false;
    nodes->insert(nodes->end(), {consumer, last});
    *output = last->output(0);
    return true;
  }
  return false;
}

// The base x of `value` = x^3: Pow(x, 3), Mul(Mul(x, x), x) or Mul(x, Mul(x, x)).
std::optional<std::string> CubeOf(const Graph& graph, const std::string& value, std::vector<Node*>* nodes) {
  Node* node = graph.Producer(value);
  if (auto base = WithConstant(graph, node, "Pow", 3.0); base && node->input(0) == *base) {
    nodes->push_back(node);
    return base;
  }
  if (node == nullptr || node->op_type() != "Mul" || !node->domain().empty() || node->input_size() != 2) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    Node* square = graph.Producer(node->input(side));
    const std::string& x = node->input(1 - side);
    if (IsMulOf(square, x, x) && SoleConsumer(graph, square->output(0)) == node) {
      nodes->insert(nodes->end(), {square, node});
      return x;
    }
  }
  return std::nullopt;
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
    if (add == nullptr || add->input_size() != 2 || SoleConsumer(graph, add->output(0)) != gelu) continue;
    for (int side = 0; side < 2; ++side) {
      const onnx::TensorProto* constant = ConstantTensor(graph, add->input(side));
      if (constant == nullptr || constant->dims_size() != 1 || constant->data_type() != onnx::TensorProto::FLOAT) continue;
      onnx::NodeProto fused = gelu->proto();
      if (onnx_gelu) {
        fused.set_domain(kMicrosoft);
        fused.clear_attribute();
        if (approximate == "tanh") fused.set_op_type("FastGelu");
        context.RequireOpset(kMicrosoft, 1);
      }
      if (fused.op_type() == "Gelu") fused.set_op_type("BiasGelu");
      fused.set_input(0, add->input(1 - side));
      fused.add_input(add->input(side));
      graph.RemoveNode(add);
      graph.RemoveNode(gelu);
      graph.AddNode(std::move(fused), gelu, /*after=*/true);
      context.CountRewrite();
      break;
    }
  }
}

class FuseGeluPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_gelu"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override {
    return "Fuse the Gelu family (erf, tanh and sigmoid forms, with a bias Add) into ONNX Runtime's Gelu, "
           "FastGelu, QuickGelu and BiasGelu";
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    for (Node* node : graph.Nodes()) {
      if (node->removed() || !node->domain().empty()) continue;
      std::vector<Node*> nodes;
      std::string x, output, fused_op;
      float alpha = 0;
      if (node->op_type() == "Erf") {
        Node* scale = graph.Producer(node->input(0));
        auto divided = WithConstant(graph, scale, "Div", std::sqrt(2.0));
        auto multiplied = WithConstant(graph, scale, "Mul", 1.0 / std::sqrt(2.0));
        if (!divided && !multiplied) continue;
        if (divided && scale->input(0) != *divided) continue;  // x / sqrt(2), not sqrt(2) / x
        x = divided ? *divided : *multiplied;
        Node* one_plus = SoleConsumer(graph, node->output(0));
        if (!WithConstant(graph, one_plus, "Add", 1.0)) continue;
        nodes = {scale, node, one_plus};
        if (!MatchHalfProductTail(graph, x, one_plus->output(0), &nodes, &output)) continue;
        fused_op = "Gelu";
      } else if (node->op_type() == "Tanh") {
        Node* scale = graph.Producer(node->input(0));
        auto inner = WithConstant(graph, scale, "Mul", std::sqrt(2.0 / M_PI));
        if (!inner) continue;
        Node* sum = graph.Producer(*inner);
        if (sum == nullptr || sum->op_type() != "Add" || sum->input_size() != 2) continue;
        bool matched = false;
        for (int side = 0; side < 2 && !matched; ++side) {
          Node* cubic = graph.Producer(sum->input(1 - side));
          auto cube = WithConstant(graph, cubic, "Mul", 0.044715);
          if (!cube) continue;
          std::vector<Node*> cube_nodes;
          auto base = CubeOf(graph, *cube, &cube_nodes);
          if (!base || *base != sum->input(side)) continue;
          x = *base;
          nodes = cube_nodes;
          nodes.insert(nodes.end(), {cubic, sum, scale, node});
          matched = true;
        }
        if (!matched) continue;
        Node* one_plus = SoleConsumer(graph, node->output(0));
        if (!WithConstant(graph, one_plus, "Add", 1.0)) continue;
        nodes.push_back(one_plus);
        if (!MatchHalfProductTail(graph, x, one_plus->output(0), &nodes, &output)) continue;
        fused_op = "FastGelu";
      } else if (node->op_type() == "Sigmoid") {
        Node* scale = graph.Producer(node->input(0));
        if (scale != nullptr && scale->op_type() == "Mul" && scale->domain().empty() && scale->input_size() == 2) {
          for (int side = 0; side < 2; ++side) {
            auto constant = ConstantScalarFloat(graph, scale->input(side));
            if (constant) {
              alpha = *constant;
              x = scale->input(1 - side);
            }
          }
        }
        Node* product = SoleConsumer(graph, node->output(0));
        if (!x.empty() && IsMulOf(product, x, node->output(0))) {
          nodes = {scale, node, product};
        } else if (IsMulOf(product, node->input(0), node->output(0))) {  // SiLU: x * sigmoid(x)
          x = node->input(0);
          alpha = 1.0f;
          nodes = {node, product};
        } else {
          continue;
        }
        output = product->output(0);
        fused_op = "QuickGelu";
      } else {
        continue;
      }
      // Intermediate values stay inside; x itself is read only by the pattern's nodes.
      bool leaks = false;
      for (Node* n : nodes) {
        if (n->output(0) == output) continue;
        if (graph.IsGraphOutput(n->output(0))) leaks = true;
        for (Node* consumer : graph.Consumers(n->output(0))) {
          leaks |= std::find(nodes.begin(), nodes.end(), consumer) == nodes.end();
        }
      }
      if (leaks) {
        context.Skip(absl::StrCat("fuse_gelu: an intermediate value of the ", fused_op, " pattern is read elsewhere"));
        continue;
      }
      // Absorb a constant bias: x = Add(h, bias[N]) read only by this pattern.
      std::string input = x, bias;
      Node* bias_add = graph.Producer(x);
      if (fused_op != "QuickGelu" && bias_add != nullptr && bias_add->op_type() == "Add" && bias_add->domain().empty() &&
          bias_add->input_size() == 2 && !graph.IsGraphOutput(x)) {
        bool only_pattern = true;
        for (Node* consumer : graph.Consumers(x)) {
          only_pattern &= std::find(nodes.begin(), nodes.end(), consumer) != nodes.end();
        }
        for (int side = 0; side < 2 && only_pattern && bias.empty(); ++side) {
          const onnx::TensorProto* constant = ConstantTensor(graph, bias_add->input(side));
          if (constant != nullptr && constant->dims_size() == 1 && constant->data_type() == onnx::TensorProto::FLOAT) {
            bias = bias_add->input(side);
            input = bias_add->input(1 - side);
          }
        }
      }
      onnx::NodeProto fused;
      fused.set_op_type(fused_op == "Gelu" && !bias.empty() ? "BiasGelu" : fused_op);
      fused.set_domain(kMicrosoft);
      fused.set_name(graph.UniqueName(fused.op_type()));
      fused.add_input(input);
      if (!bias.empty()) fused.add_input(bias);
      fused.add_output(output);
      if (fused_op == "QuickGelu") *fused.add_attribute() = FloatAttribute("alpha", alpha);
      Node* anchor = nodes.back();
      for (Node* n : nodes) graph.RemoveNode(n);
      if (!bias.empty()) graph.RemoveNode(bias_add);
      graph.AddNode(std::move(fused), anchor, /*after=*/true);
      context.RequireOpset(kMicrosoft, 1);
      context.CountRewrite();
    }
    AbsorbBiasIntoFusedGelu(graph, context);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseGeluPass() { return std::make_unique<FuseGeluPass>(); }

}  // namespace onnxopt
