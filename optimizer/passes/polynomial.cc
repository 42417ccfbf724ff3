#include "optimizer/passes/polynomial.h"

#include <algorithm>
#include <cmath>

#include "optimizer/passes/match.h"

namespace onnxopt {
namespace {

using Coefficients = std::array<double, Polynomial::kMaxDegree + 1>;

std::optional<Coefficients> Times(const Coefficients& a, const Coefficients& b) {
  Coefficients product{};
  for (int i = 0; i <= Polynomial::kMaxDegree; ++i) {
    for (int j = 0; j <= Polynomial::kMaxDegree; ++j) {
      if (a[i] == 0 || b[j] == 0) continue;
      if (i + j > Polynomial::kMaxDegree) return std::nullopt;
      product[i + j] += a[i] * b[j];
    }
  }
  return product;
}

Coefficients Plus(const Coefficients& a, const Coefficients& b, double sign) {
  Coefficients sum{};
  for (int i = 0; i <= Polynomial::kMaxDegree; ++i) sum[i] = a[i] + sign * b[i];
  return sum;
}

class PolynomialBuilder {
 public:
  PolynomialBuilder(const Graph& graph, int max_nodes) : graph_(graph), max_nodes_(max_nodes) {}

  // `value` expanded through the arithmetic that computes it; where that expansion does not give a
  // polynomial of one variable (x = Add(h, bias[N]) reads two non-scalars), `value` itself is the
  // variable.
  std::optional<Coefficients> Of(const std::string& value) {
    if (std::optional<float> constant = ConstantScalarFloat(graph_, value)) return Constant(*constant);
    Node* node = graph_.Producer(value);
    if (node == nullptr || !node->domain().empty() || !IsArithmetic(*node)) return Variable(value);
    const std::string variable_before = variable_;
    const size_t nodes_before = nodes_.size();
    if (std::optional<Coefficients> expanded = Expand(node)) return expanded;
    variable_ = variable_before;
    nodes_.resize(nodes_before);
    return Variable(value);
  }

  const std::string& variable() const { return variable_; }
  std::vector<Node*> TakeNodes() { return std::move(nodes_); }

 private:
  std::optional<Coefficients> Expand(Node* node) {
    if (std::find(nodes_.begin(), nodes_.end(), node) == nodes_.end()) {
      if (static_cast<int>(nodes_.size()) >= max_nodes_) return std::nullopt;
      nodes_.push_back(node);
    }
    const absl::string_view op = node->op_type();
    if (op == "Neg") {
      std::optional<Coefficients> a = Of(node->input(0));
      if (!a) return std::nullopt;
      return Plus(Coefficients{}, *a, -1);
    }
    if (op == "Pow") return Power(*node);
    std::optional<Coefficients> a = Of(node->input(0));
    if (!a) return std::nullopt;
    if (op == "Div") {
      std::optional<float> divisor = ConstantScalarFloat(graph_, node->input(1));
      if (!divisor || *divisor == 0) return std::nullopt;
      return Times(*a, Constant(1.0 / *divisor));
    }
    std::optional<Coefficients> b = Of(node->input(1));
    if (!b) return std::nullopt;
    if (op == "Mul") return Times(*a, *b);
    return Plus(*a, *b, op == "Sub" ? -1 : 1);
  }

  static bool IsArithmetic(const Node& node) {
    const absl::string_view op = node.op_type();
    if (op == "Neg") return node.input_size() == 1;
    return node.input_size() == 2 && (op == "Mul" || op == "Add" || op == "Sub" || op == "Div" || op == "Pow");
  }

  static Coefficients Constant(double value) {
    Coefficients c{};
    c[0] = value;
    return c;
  }

  // The one variable: a value no arithmetic node computes, or one whose expansion gave no polynomial
  // of a single variable.
  std::optional<Coefficients> Variable(const std::string& value) {
    if (!variable_.empty() && variable_ != value) return std::nullopt;
    variable_ = value;
    Coefficients c{};
    c[1] = 1;
    return c;
  }

  std::optional<Coefficients> Power(const Node& pow) {
    std::optional<float> exponent = ConstantScalarFloat(graph_, pow.input(1));
    if (!exponent || *exponent < 1 || *exponent > Polynomial::kMaxDegree || std::floor(*exponent) != *exponent) {
      return std::nullopt;
    }
    std::optional<Coefficients> base = Of(pow.input(0));
    std::optional<Coefficients> result = base;
    for (int i = 1; result && i < static_cast<int>(*exponent); ++i) result = Times(*result, *base);
    return result;
  }

  const Graph& graph_;
  const int max_nodes_;
  std::string variable_;
  std::vector<Node*> nodes_;
};

}  // namespace

bool Polynomial::Is(const std::map<int, double>& expected, double relative) const {
  double scale = 0;
  for (const auto& [degree, want] : expected) scale = std::max(scale, std::fabs(want));
  for (int degree = 0; degree <= kMaxDegree; ++degree) {
    auto it = expected.find(degree);
    const double got = coefficients[degree];
    // A term that should be absent may be left by a cancellation's rounding: within 1e-6 of the scale.
    if (it == expected.end() ? std::fabs(got) > 1e-6 * scale : std::fabs(got - it->second) > relative * std::fabs(it->second)) {
      return false;
    }
  }
  return true;
}

std::optional<Polynomial> PolynomialOf(const Graph& graph, const std::string& value, int max_nodes) {
  PolynomialBuilder builder(graph, max_nodes);
  std::optional<Coefficients> coefficients = builder.Of(value);
  if (!coefficients || builder.variable().empty()) return std::nullopt;
  Polynomial polynomial;
  polynomial.variable = builder.variable();
  polynomial.coefficients = *coefficients;
  polynomial.nodes = builder.TakeNodes();
  return polynomial;
}

}  // namespace onnxopt
