// fuse_layer_norm: the decomposed LayerNorm exporters write becomes one LayerNormalization.
//
// Before:  mean = ReduceMean(X, axes=[-1]); d = Sub(X, mean); v = ReduceMean(Pow(d, 2) | Mul(d, d));
//          n = Div(d, Sqrt(Add(v, eps)))  [or Mul(d, Reciprocal(Sqrt(...)))];
//          Y = Add(Mul(n, gamma), beta)   [operands in either order; gamma/beta optional]
// After:   Y = LayerNormalization(X, gamma, beta, axis=-1, epsilon=eps)
// Checked before rewriting: both reductions over the last axis only (keepdims), the exponent is 2,
// eps is a scalar constant, gamma/beta are constants that broadcast over the last axis, and no
// intermediate value is read outside the pattern. LayerNormalization is standard from opset 17;
// below that it is ONNX Runtime's (same name, ONNX domain), which the report's runtimes say.
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

// The other input of a binary node, given one.
std::string Other(const Node& node, const std::string& one) { return node.input(0) == one ? node.input(1) : node.input(0); }

bool ReducesLastAxis(const Node& node, const Graph& graph, int64_t opset, int rank) {
  if (node.GetAttributeInt("keepdims", 1) != 1) return false;
  std::optional<std::vector<int64_t>> axes;
  if (opset >= 18) {
    if (node.input_size() < 2) return false;
    axes = ConstantInts(graph, node.input(1));
  } else if (const onnx::AttributeProto* attribute = node.FindAttribute("axes")) {
    axes = std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
  }
  return axes && axes->size() == 1 && ((*axes)[0] == -1 || (rank > 0 && (*axes)[0] == rank - 1));
}

class FuseLayerNormPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_layer_norm"; }
  absl::string_view description() const override {
    return "Fuse ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div(/Mul/Add) into LayerNormalization";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const int64_t opset = context.OpsetVersion("");
    for (Node* mean : graph.Nodes()) {
      if (mean->removed() || mean->op_type() != "ReduceMean" || !mean->domain().empty()) continue;
      const std::string x = mean->input(0);
      const auto rank = context.shapes() ? context.shapes()->Rank(x) : std::nullopt;
      if (!ReducesLastAxis(*mean, graph, opset, rank.value_or(0))) continue;
      // d = Sub(X, mean): the one Sub that reads both.
      Node* sub = nullptr;
      for (Node* consumer : graph.Consumers(mean->output(0))) {
        if (consumer->op_type() == "Sub" && consumer->domain().empty() && consumer->input(0) == x &&
            consumer->input(1) == mean->output(0)) {
          sub = consumer;
        }
      }
      if (sub == nullptr) continue;
      const std::string d = sub->output(0);
      Node* square = nullptr;
      Node* divide = nullptr;  // Div(d, s) or Mul(d, Reciprocal(s))
      for (Node* consumer : graph.Consumers(d)) {
        const std::string& op = consumer->op_type();
        if (op == "Pow" && consumer->input(0) == d) square = consumer;
        if (op == "Mul" && consumer->input(0) == d && consumer->input(1) == d) square = consumer;
        if (op == "Div" && consumer->input(0) == d) divide = consumer;
        if (op == "Mul" && !(consumer->input(0) == d && consumer->input(1) == d)) divide = consumer;
      }
      if (square == nullptr || divide == nullptr) continue;
      if (square->op_type() == "Pow") {
        auto exponent = ConstantScalarFloat(graph, square->input(1));
        if (!exponent || *exponent != 2.0f) {
          context.Skip("fuse_layer_norm: Pow exponent is not the constant 2");
          continue;
        }
      }
      Node* variance = graph.Consumers(square->output(0)).size() == 1 ? graph.Consumers(square->output(0))[0] : nullptr;
      if (variance == nullptr || variance->op_type() != "ReduceMean" ||
          !ReducesLastAxis(*variance, graph, opset, rank.value_or(0))) {
        continue;
      }
      Node* add_eps = graph.Consumers(variance->output(0)).size() == 1 ? graph.Consumers(variance->output(0))[0] : nullptr;
      if (add_eps == nullptr || add_eps->op_type() != "Add") continue;
      auto epsilon = ConstantScalarFloat(graph, Other(*add_eps, variance->output(0)));
      Node* sqrt = graph.Consumers(add_eps->output(0)).size() == 1 ? graph.Consumers(add_eps->output(0))[0] : nullptr;
      if (!epsilon || sqrt == nullptr || sqrt->op_type() != "Sqrt") {
        context.Skip("fuse_layer_norm: epsilon is not a scalar constant added before Sqrt");
        continue;
      }
      std::vector<Node*> pattern = {mean, sub, square, variance, add_eps, sqrt, divide};
      if (divide->op_type() == "Div") {
        if (divide->input(1) != sqrt->output(0)) continue;
      } else {  // Mul(d, Reciprocal(sqrt))
        Node* reciprocal = ProducerWithOp(graph, Other(*divide, d), "Reciprocal");
        if (reciprocal == nullptr || reciprocal->input(0) != sqrt->output(0)) continue;
        pattern.push_back(reciprocal);
      }
      // Optional scale and shift.
      std::string output = divide->output(0);
      std::string gamma, beta;
      auto single_consumer = [&](const std::string& value, const char* op) -> Node* {
        Node* consumer = SoleConsumer(graph, value);
        return consumer != nullptr && consumer->op_type() == op ? consumer : nullptr;
      };
      auto last_axis_constant = [&](const std::string& value) {
        const onnx::TensorProto* tensor = ConstantTensor(graph, value);
        return tensor != nullptr && tensor->dims_size() == 1 && tensor->data_type() == onnx::TensorProto::FLOAT;
      };
      if (Node* scale = single_consumer(output, "Mul"); scale != nullptr && last_axis_constant(Other(*scale, output))) {
        gamma = Other(*scale, output);
        pattern.push_back(scale);
        output = scale->output(0);
        if (Node* shift = single_consumer(output, "Add"); shift != nullptr && last_axis_constant(Other(*shift, output))) {
          beta = Other(*shift, output);
          pattern.push_back(shift);
          output = shift->output(0);
        }
      }
      if (gamma.empty()) {
        context.Skip("fuse_layer_norm: no constant scale after the normalization");
        continue;
      }
      // Nothing outside the pattern may read an intermediate value.
      bool leaks = false;
      for (Node* node : pattern) {
        if (node->output(0) == output) continue;
        if (graph.IsGraphOutput(node->output(0))) leaks = true;
        for (Node* consumer : graph.Consumers(node->output(0))) {
          if (std::find(pattern.begin(), pattern.end(), consumer) == pattern.end()) leaks = true;
        }
      }
      if (leaks) {
        context.Skip("fuse_layer_norm: an intermediate value is read outside the pattern");
        continue;
      }
      onnx::NodeProto fused;
      fused.set_op_type("LayerNormalization");
      fused.set_name(graph.UniqueName("LayerNorm"));
      fused.add_input(x);
      fused.add_input(gamma);
      if (!beta.empty()) fused.add_input(beta);
      fused.add_output(output);
      auto* axis = fused.add_attribute();
      axis->set_name("axis");
      axis->set_type(onnx::AttributeProto::INT);
      axis->set_i(-1);
      auto* eps = fused.add_attribute();
      eps->set_name("epsilon");
      eps->set_type(onnx::AttributeProto::FLOAT);
      eps->set_f(*epsilon);
      Node* anchor = pattern.back();
      for (Node* node : pattern) graph.RemoveNode(node);
      graph.AddNode(std::move(fused), anchor, /*after=*/true);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseLayerNormPass() { return std::make_unique<FuseLayerNormPass>(); }

}  // namespace onnxopt
