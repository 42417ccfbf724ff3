// A value as a polynomial of one other value: the Gelu family's inner arguments, recognized by what
// they compute rather than by how an exporter spelled them (design.md: "match meaning").
//
//   sqrt(2/pi) * (x + 0.044715 * x^3)          (the tanh approximation, Pow or x*x*x)
//   x * 0.7978845608 * (1 + 0.044715 * x * x)  (Hugging Face's FastGELU, Megatron's gelu_impl)
//   x * (0.7978845608 + 0.0356774 * x * x)     (the same with its constants folded)
// are all 0.7978845608 x + 0.0356774 x^3, and x / sqrt(2) is 0.7071 x.
#ifndef ONNXOPT_OPTIMIZER_PASSES_POLYNOMIAL_H_
#define ONNXOPT_OPTIMIZER_PASSES_POLYNOMIAL_H_

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "optimizer/graph.h"

namespace onnxopt {

struct Polynomial {
  static constexpr int kMaxDegree = 4;
  std::string variable;                                // the one non-constant value it is of
  std::array<double, kMaxDegree + 1> coefficients{};   // by degree
  std::vector<Node*> nodes;                            // the nodes that compute it, each once

  // Exactly the `expected` degree -> coefficient terms (each within `relative` of its value), every
  // other coefficient zero.
  bool Is(const std::map<int, double>& expected, double relative) const;
};

// `value` as a polynomial in one variable, expanded as deep as the arithmetic allows: through
// default-domain Mul, Add, Sub, Neg, Div by a scalar constant and Pow by a constant integer, with scalar
// float constants, in at most `max_nodes` nodes and up to degree kMaxDegree. Where a value's expansion
// would read a second variable (x = Add(h, bias[N])), another operator, or a higher degree, that value
// is the variable; so every non-constant value is at least the polynomial 1 x of itself. nullopt for a
// constant.
std::optional<Polynomial> PolynomialOf(const Graph& graph, const std::string& value, int max_nodes = 16);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_POLYNOMIAL_H_
