// lower_einsum: Keras' EinsumDense and MultiHeadAttention (and tf2onnx's export of them) write a
// transformer's projections and attention products as two-operand Einsums. Each is one MatMul between
// Transposes and Reshapes, the form the attention fusion and ONNX Runtime's kernels know.
//
// Before:  q = Einsum("abc,cde->abde", x, Wq)         x [B, S, H], Wq [H, N, D] (constant)
//          q = Add(q, bq)                             bq [N, D]
//          scores = Einsum("aecd,abcd->acbe", k, q)   k, q [B, S, N, D]
//          context = Einsum("acbe,aecd->abcd", p, v)  p [B, N, S, S]
//          out = Einsum("abcd,cde->abe", context, Wo) Wo [N, D, H] (constant)
// After:   q = Reshape(Add(MatMul(x, Wq as [H, N*D]), bq as [N*D]), [0, 0, N, D])
//          scores = MatMul(Transpose(q, [0,2,1,3]), Transpose(k, [0,2,3,1]))
//          context = Transpose(MatMul(p, Transpose(v, [0,2,1,3])), [0,2,1,3])
//          out = MatMul(Reshape(context, [0, 0, N*D]), Wo as [N*D, H])
// In general: indices in both operands and the output are batch axes (kept leading on both sides), in
// both operands only are contracted, in one operand and the output are that side's free axes; the
// operands are transposed to [batch, free, contracted] and [batch, contracted, free], groups of more than
// one axis flattened, and the product unflattened and transposed to the output's order.
// A bias over the free axes and a scalar scale after it join the product before it is unflattened.
// Checked: two operands, letters only (no ellipsis), no letter twice in a term, none summed out of a
// single operand, every axis group non-empty; the size of every axis that is flattened is known (a
// [B, S] pair of free axes stays unflattened as the leading axes of a product with a constant matrix). A
// constant operand already in its order is reshaped in place (a new initializer, same data); one that
// needs a Transpose gets the nodes, for constant folding. Equal on every input: the same sums of products.
#include <algorithm>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

struct Equation {
  std::string a, b, out;
};

std::optional<Equation> ParseEquation(std::string text) {
  text.erase(std::remove_if(text.begin(), text.end(), absl::ascii_isspace), text.end());
  const std::vector<std::string> sides = absl::StrSplit(text, "->");
  if (sides.size() != 2) return std::nullopt;
  const std::vector<std::string> terms = absl::StrSplit(sides[0], ',');
  if (terms.size() != 2) return std::nullopt;
  Equation equation{terms[0], terms[1], sides[1]};
  for (const std::string* term : {&equation.a, &equation.b, &equation.out}) {
    if (term->empty()) return std::nullopt;
    for (size_t i = 0; i < term->size(); ++i) {
      if (!absl::ascii_isalpha((*term)[i]) || term->find((*term)[i], i + 1) != std::string::npos) return std::nullopt;
    }
  }
  return equation;
}

bool Has(const std::string& term, char letter) { return term.find(letter) != std::string::npos; }

// The axes of the product, by role.
struct Groups {
  std::string batch, free_a, free_b, contracted;
};

std::optional<Groups> GroupAxes(const Equation& e) {
  Groups groups;
  for (char letter : e.out) {
    if (!Has(e.a, letter) && !Has(e.b, letter)) return std::nullopt;
    if (Has(e.a, letter) && Has(e.b, letter)) {
      groups.batch += letter;
    } else {
      (Has(e.a, letter) ? groups.free_a : groups.free_b) += letter;
    }
  }
  for (char letter : e.a) {
    if (Has(e.out, letter)) continue;
    if (!Has(e.b, letter)) return std::nullopt;  // summed out of one operand: a ReduceSum, not a product
    groups.contracted += letter;
  }
  for (char letter : e.b) {
    if (!Has(e.out, letter) && !Has(e.a, letter)) return std::nullopt;
  }
  if (groups.free_a.empty() || groups.free_b.empty() || groups.contracted.empty()) return std::nullopt;
  return groups;
}

// The permutation that takes `from`'s axes to the order of `to` (the same letters).
std::vector<int64_t> Permutation(const std::string& from, const std::string& to) {
  std::vector<int64_t> perm;
  for (char letter : to) perm.push_back(static_cast<int64_t>(from.find(letter)));
  return perm;
}

bool IsIdentity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

class Lowering {
 public:
  // Operands in the order that puts the output's axes in the product's own order where swapping them
  // does (Keras' scores Einsum reads the keys first: the product is Q K^T with no Transpose after).
  Lowering(Graph& graph, const ShapeInfo& shapes, const Node& einsum, Equation equation)
      : graph_(graph), shapes_(shapes), einsum_(einsum), e_(std::move(equation)), inputs_{einsum.input(0), einsum.input(1)} {
    if (std::optional<Groups> groups = GroupAxes(e_)) g_ = *groups;
    Equation swapped{e_.b, e_.a, e_.out};
    std::optional<Groups> other = GroupAxes(swapped);
    if (other && !IsIdentity(Permutation(g_.batch + g_.free_a + g_.free_b, e_.out)) &&
        IsIdentity(Permutation(other->batch + other->free_a + other->free_b, e_.out))) {
      e_ = swapped;
      g_ = *other;
      std::swap(inputs_[0], inputs_[1]);
    }
  }

  // The size of an axis, from either operand's inferred shape or constant.
  std::optional<int64_t> Size(char letter) const {
    for (int side = 0; side < 2; ++side) {
      const std::string& term = side == 0 ? e_.a : e_.b;
      const size_t axis = term.find(letter);
      if (axis == std::string::npos) continue;
      const std::string& value = inputs_[side];
      if (const onnx::TensorProto* constant = graph_.Initializer(value)) {
        if (constant->dims_size() == static_cast<int>(term.size())) return constant->dims(static_cast<int>(axis));
      }
      if (auto dim = shapes_.DimValue(value, static_cast<int>(axis))) return *dim;
    }
    return std::nullopt;
  }

  std::optional<int64_t> Product(const std::string& letters) const {
    int64_t product = 1;
    for (char letter : letters) {
      std::optional<int64_t> size = Size(letter);
      if (!size || *size <= 0) return std::nullopt;
      product *= *size;
    }
    return product;
  }

  bool RankKnown(int side) const {
    const std::string& term = side == 0 ? e_.a : e_.b;
    const std::string& value = inputs_[side];
    if (const onnx::TensorProto* constant = graph_.Initializer(value)) return constant->dims_size() == static_cast<int>(term.size());
    const std::optional<int> rank = shapes_.Rank(value);
    return rank && *rank == static_cast<int>(term.size());
  }

  // Why it cannot be lowered, or "" when it can.
  std::string Check() const {
    if (!RankKnown(0) || !RankKnown(1)) return "an operand's rank is unknown or differs from its term";
    if (g_.contracted.size() > 1 && !Product(g_.contracted)) return "the contracted axes' sizes are unknown";
    if (g_.free_b.size() > 1 && !Product(g_.free_b)) return "the second operand's free axes' sizes are unknown";
    if (g_.free_a.size() > 1 && !Product(g_.free_a) && !g_.batch.empty()) {
      return "the first operand's free axes' sizes are unknown beside batch axes";
    }
    return "";
  }

  void Emit(PassContext& context) {
    const std::string hint = einsum_.name().empty() ? "einsum" : einsum_.name();
    NodeChain chain(graph_, &einsum_);
    // [batch, free_a, contracted] and [batch, contracted, free_b], groups of several axes flattened; 0
    // copies an axis where it stays (the batch axes lead on both sides, free_a kept whole follows them).
    // Without batch axes the product broadcasts over free_a's leading axes: they stay (a flattened
    // [B*S, H] projection would become a Gemm the attention fusion does not read as one).
    const bool flatten_a = g_.free_a.size() > 1 && !g_.batch.empty() && Product(g_.free_a).has_value();
    std::vector<int64_t> a_shape(g_.batch.size(), 0);
    if (flatten_a) {
      a_shape.push_back(*Product(g_.free_a));
    } else {
      a_shape.insert(a_shape.end(), g_.free_a.size(), 0);
    }
    a_shape.push_back(GroupDim(g_.contracted));
    std::vector<int64_t> b_shape(g_.batch.size(), 0);
    b_shape.push_back(GroupDim(g_.contracted));
    b_shape.push_back(GroupDim(g_.free_b));
    const std::string x = Operand(chain, 0, g_.batch + g_.free_a + g_.contracted, a_shape,
                                  flatten_a || g_.contracted.size() > 1, hint);
    const std::string y = Operand(chain, 1, g_.batch + g_.contracted + g_.free_b, b_shape,
                                  g_.contracted.size() > 1 || g_.free_b.size() > 1, hint);
    std::string product = chain.Add("MatMul", {x, y}, hint + "_matmul");
    // Unflattened to [batch, free_a, free_b], then in the output's order.
    const std::vector<int64_t> perm = Permutation(g_.batch + g_.free_a + g_.free_b, e_.out);
    const bool unflatten = flatten_a || g_.free_b.size() > 1;
    std::vector<int64_t> unflattened(g_.batch.size(), 0);
    for (char letter : g_.free_a) unflattened.push_back(flatten_a ? *Size(letter) : 0);
    for (char letter : g_.free_b) unflattened.push_back(Size(letter).value_or(-1));
    std::string output = einsum_.output(0);
    if (unflatten && IsIdentity(perm)) {
      // A bias over a projection's free axes joins the product before it is unflattened.
      if (Node* add = BiasAdd()) {
        product = chain.Add("Add", {product, FlatBias(*add, hint)}, hint + "_bias");
        output = add->output(0);
        graph_.RemoveNode(add);
      }
      // And a scalar scale after it (Keras scales the query heads), so that the heads are split last.
      Node* scale = SoleConsumer(graph_, output);
      const bool scales = scale != nullptr && !graph_.IsGraphOutput(output) && ScalarScale(graph_, scale) &&
                          (scale->op_type() == "Mul" || scale->input(0) == output);
      if (scales) {
        const std::string& factor = scale->input(0) == output ? scale->input(1) : scale->input(0);
        product = chain.Add(std::string(scale->op_type()), {product, factor}, hint + "_scaled");
        output = scale->output(0);
        graph_.RemoveNode(scale);
      }
    }
    if (unflatten) {
      const std::string shape = AddInt64Initializer(graph_, hint + "_shape", unflattened);
      if (IsIdentity(perm)) {
        chain.AddNode(MakeNode("Reshape", graph_.UniqueName(hint + "_unflatten"), {product, shape}, {output}));
      } else {
        product = chain.Add("Reshape", {product, shape}, hint + "_unflatten");
      }
    }
    if (!IsIdentity(perm)) {
      onnx::NodeProto transpose = MakeNode("Transpose", graph_.UniqueName(hint + "_order"), {product}, {output});
      *transpose.add_attribute() = MakeIntsAttribute("perm", perm);
      chain.AddNode(std::move(transpose));
    } else if (!unflatten) {
      chain.AddNode(MakeNode("Identity", graph_.UniqueName(hint + "_out"), {product}, {output}));
    }
    graph_.RemoveNode(const_cast<Node*>(&einsum_));
    context.CountRewrite();
  }

 private:
  // A group's flattened size: the product of its sizes, or -1 for one axis of unknown size.
  int64_t GroupDim(const std::string& letters) const {
    if (std::optional<int64_t> product = Product(letters)) return *product;
    return -1;  // Check() let only a single axis through unknown
  }

  // Operand `side` transposed to `order` and, when `reshape`, reshaped to `shape`. A constant already in
  // that order becomes a new initializer of the shape (same data).
  std::string Operand(NodeChain& chain, int side, const std::string& order, const std::vector<int64_t>& shape,
                      bool reshape, const std::string& hint) {
    const std::string& term = side == 0 ? e_.a : e_.b;
    const std::string& value = inputs_[side];
    const std::vector<int64_t> perm = Permutation(term, order);
    if (const onnx::TensorProto* constant = graph_.Initializer(value); constant != nullptr && IsIdentity(perm)) {
      if (!reshape) return value;
      onnx::TensorProto reshaped = *constant;
      reshaped.set_name(graph_.UniqueName(value + "_as_matrix"));
      reshaped.clear_dims();
      int64_t elements = 1, placed = 1;
      for (int64_t dim : constant->dims()) elements *= dim;
      std::vector<int64_t> dims = shape;
      for (size_t i = 0; i < dims.size(); ++i) {
        if (dims[i] == 0) dims[i] = constant->dims(static_cast<int>(i));
        if (dims[i] > 0) placed *= dims[i];
      }
      for (int64_t dim : dims) reshaped.add_dims(dim > 0 ? dim : elements / placed);
      return graph_.AddInitializer(std::move(reshaped))->name();
    }
    std::string current = value;
    if (!IsIdentity(perm)) {
      current = chain.Add("Transpose", {current}, hint + (side == 0 ? "_a" : "_b"), {MakeIntsAttribute("perm", perm)});
    }
    if (reshape) {
      current = chain.Add("Reshape", {current, AddInt64Initializer(graph_, hint + "_flat", shape)},
                          hint + (side == 0 ? "_a_flat" : "_b_flat"));
    }
    return current;
  }

  // The Add of a constant over the second operand's free axes that alone reads the Einsum, if any.
  Node* BiasAdd() const {
    Node* add = SoleConsumer(graph_, einsum_.output(0));
    if (add == nullptr || add->op_type() != "Add" || !add->domain().empty() || graph_.IsGraphOutput(einsum_.output(0))) {
      return nullptr;
    }
    const std::string& other = add->input(0) == einsum_.output(0) ? add->input(1) : add->input(0);
    const onnx::TensorProto* bias = graph_.Initializer(other);
    if (bias == nullptr || bias->dims_size() != static_cast<int>(g_.free_b.size())) return nullptr;
    for (size_t i = 0; i < g_.free_b.size(); ++i) {
      if (bias->dims(static_cast<int>(i)) != Size(g_.free_b[i])) return nullptr;
    }
    return add;
  }

  std::string FlatBias(const Node& add, const std::string& hint) {
    const std::string& other = add.input(0) == einsum_.output(0) ? add.input(1) : add.input(0);
    onnx::TensorProto flat = *graph_.Initializer(other);
    flat.set_name(graph_.UniqueName(hint + "_bias_flat"));
    flat.clear_dims();
    flat.add_dims(*Product(g_.free_b));
    return graph_.AddInitializer(std::move(flat))->name();
  }

  Graph& graph_;
  const ShapeInfo& shapes_;
  const Node& einsum_;
  Equation e_;
  std::string inputs_[2];
  Groups g_;
};

class LowerEinsumPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "lower_einsum"; }
  absl::string_view description() const override {
    return "Lower two-operand Einsums (Keras' EinsumDense and attention products) into MatMul between Transposes and "
           "Reshapes";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    for (Node* einsum : graph.Nodes()) {
      if (einsum->removed() || einsum->op_type() != "Einsum" || !einsum->domain().empty() || einsum->input_size() != 2) {
        continue;
      }
      const onnx::AttributeProto* attribute = einsum->FindAttribute("equation");
      std::optional<Equation> equation = attribute ? ParseEquation(attribute->s()) : std::nullopt;
      std::optional<Groups> groups = equation ? GroupAxes(*equation) : std::nullopt;
      if (!groups) continue;
      const std::optional<int32_t> type = shapes.ElementType(einsum->output(0));
      if (type && *type != onnx::TensorProto::FLOAT && *type != onnx::TensorProto::FLOAT16 &&
          *type != onnx::TensorProto::BFLOAT16 && *type != onnx::TensorProto::DOUBLE) {
        continue;  // MatMul is defined for floating types (and 32/64-bit integers, which Einsum rarely is)
      }
      Lowering lowering(graph, shapes, *einsum, *equation);
      if (const std::string why = lowering.Check(); !why.empty()) {
        context.Skip(absl::StrCat("lower_einsum: ", attribute->s(), ": ", why));
        continue;
      }
      lowering.Emit(context);
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeLowerEinsumPass() { return std::make_unique<LowerEinsumPass>(); }

}  // namespace onnxopt
