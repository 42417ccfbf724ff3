#include "optimizer/symbolic_shapes.h"

#include <map>
#include <optional>
#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/strings/str_cat.h"
#include "optimizer/dim_sums.h"
#include "optimizer/graph.h"

namespace onnxopt {
namespace {

// One dimension: a number, a named symbol, or unknown.
struct Dim {
  enum class Kind { kUnknown, kValue, kParam } kind = Kind::kUnknown;
  int64_t value = 0;
  std::string param;
  static Dim Value(int64_t v) { return {Kind::kValue, v, ""}; }
  static Dim Param(std::string p) { return {Kind::kParam, 0, std::move(p)}; }
  bool known() const { return kind != Kind::kUnknown; }
  bool operator==(const Dim& o) const { return kind == o.kind && value == o.value && param == o.param; }
};

// onnx's inference names the dims it cannot work out "unk__N"; for recovery those are unknown.
bool IsGeneratedName(const std::string& param) { return param.rfind("unk__", 0) == 0; }

// A dim as a sum of symbols and a number; nullopt if it is unknown.
std::optional<DimSum> SumOf(const Dim& d) {
  if (d.kind == Dim::Kind::kValue) return DimSum::Number(d.value);
  if (d.kind == Dim::Kind::kParam) return DimSum::Parse(d.param);
  return std::nullopt;
}

Dim FromSum(const DimSum& sum) { return sum.IsNumber() ? Dim::Value(sum.constant) : Dim::Param(sum.Spell()); }

// True if `d` cannot be negative: a number >= 0, or a sum of sizes with coefficients and number >= 0.
bool NonNegative(const Dim& d) {
  const std::optional<DimSum> sum = SumOf(d);
  if (!sum || sum->constant < 0) return false;
  for (const auto& [symbol, coefficient] : sum->terms) {
    if (coefficient < 0) return false;
  }
  return true;
}

// True if `d` cannot be negative where every size is at least 1: positive coefficients whose total and
// the number are not below 0 (2*T - 1, T - 1).
bool NonNegativeForSizes(const Dim& d) {
  const std::optional<DimSum> sum = SumOf(d);
  if (!sum) return false;
  int64_t lowest = sum->constant;
  for (const auto& [symbol, coefficient] : sum->terms) {
    if (coefficient <= 0) return false;
    lowest += coefficient;
  }
  return lowest >= 0;
}

// `d` / `divisor` as ONNX's integer Div computes it, where that is a sum again: every coefficient a
// multiple of the divisor and `d` never negative for sizes of at least 1 (positive coefficients whose
// total and the number are not below 0: 2*T - 1), so truncation is floor: (2*T - 1) / 2 = T - 1.
Dim DivideSum(const Dim& d, int64_t divisor) {
  const std::optional<DimSum> sum = SumOf(d);
  if (!sum || divisor <= 0) return {};
  if (!NonNegativeForSizes(d)) return {};
  DimSum quotient;
  for (const auto& [symbol, coefficient] : sum->terms) {
    if (coefficient % divisor != 0) return {};
    quotient.terms[symbol] = coefficient / divisor;
  }
  const int64_t c = sum->constant;
  quotient.constant = c >= 0 ? c / divisor : -((-c + divisor - 1) / divisor);
  return FromSum(quotient);
}

// The length a step-1 Slice of a dim `dim` from `start` to `end` leaves. Numbers are clamped as ONNX
// does where the dim is a number; a number past the end (INT_MAX) is the end; a negative number counts
// from the end. A symbolic bound on a numeric dim (a table cut to the lengths the graph computes:
// positions `pe[:, c - T + 1 : c + T]`) is taken within it: past the table the model cannot run. On a
// symbolic dim a bound counts only where it is provably within the dim (T - 1 of T, not 5 of S).
Dim SlicedLength(const Dim& dim, Dim start, Dim end) {
  constexpr int64_t kPastAnyEnd = int64_t{1} << 31;
  auto within = [&](const Dim& b) {
    if (dim.kind == Dim::Kind::kValue || b == dim) return true;
    const std::optional<DimSum> d = SumOf(dim), at = SumOf(b);
    return d && at && NonNegativeForSizes(b) && NonNegativeForSizes(FromSum(d->Plus(*at, -1)));
  };
  auto bound = [&](Dim b) -> std::optional<Dim> {
    if (b.kind != Dim::Kind::kValue) {
      return b.known() && within(b) ? std::optional<Dim>(b) : std::nullopt;
    }
    if (dim.kind == Dim::Kind::kValue) {
      int64_t v = b.value < 0 ? b.value + dim.value : b.value;
      return Dim::Value(std::clamp<int64_t>(v, 0, dim.value));
    }
    if (b.value >= kPastAnyEnd) return dim.known() ? std::optional<Dim>(dim) : std::nullopt;
    if (!dim.known()) return std::nullopt;
    const Dim at = b.value < 0 ? FromSum(SumOf(dim)->Plus(DimSum::Number(b.value))) : b;
    return b.value == 0 || within(at) ? std::optional<Dim>(at) : std::nullopt;
  };
  const std::optional<Dim> from = bound(start), to = bound(end);
  if (!from || !to) return {};
  if (*from == Dim::Value(0) && *to == dim) return dim;
  const Dim length = FromSum(SumOf(*to)->Plus(*SumOf(*from), -1));
  if (length.kind == Dim::Kind::kValue) return Dim::Value(std::max<int64_t>(length.value, 0));
  return NonNegativeForSizes(length) ? length : Dim();
}

Dim FromProto(const onnx::TensorShapeProto::Dimension& d) {
  if (d.has_dim_value()) return Dim::Value(d.dim_value());
  if (!d.has_dim_param() || d.dim_param().empty() || IsGeneratedName(d.dim_param())) return {};
  // A declared sum ("sequence + past_sequence") is read in the one spelling computed sums get.
  if (d.dim_param().find(' ') != std::string::npos) return FromSum(DimSum::Parse(d.dim_param()));
  return Dim::Param(d.dim_param());
}

void ToProto(const Dim& dim, onnx::TensorShapeProto::Dimension* d) {
  if (dim.kind == Dim::Kind::kValue) d->set_dim_value(dim.value);
  if (dim.kind == Dim::Kind::kParam) d->set_dim_param(dim.param);
}

// A product of dims as coefficient * symbols^powers, to solve Reshape's -1.
struct Monomial {
  int64_t coefficient = 1;
  std::map<std::string, int> powers;
  bool Multiply(const Dim& d) {
    if (d.kind == Dim::Kind::kValue) {
      coefficient *= d.value;
      return true;
    }
    if (d.kind == Dim::Kind::kParam) {
      ++powers[d.param];
      return true;
    }
    return false;
  }
};

// a / b as a Dim, when it is a number or a single symbol.
Dim Divide(const Monomial& a, const Monomial& b) {
  if (b.coefficient == 0 || a.coefficient % b.coefficient != 0) return {};
  std::map<std::string, int> powers = a.powers;
  for (const auto& [symbol, power] : b.powers) {
    powers[symbol] -= power;
    if (powers[symbol] == 0) powers.erase(symbol);
  }
  const int64_t coefficient = a.coefficient / b.coefficient;
  if (powers.empty()) return Dim::Value(coefficient);
  if (powers.size() == 1 && powers.begin()->second == 1 && coefficient == 1) return Dim::Param(powers.begin()->first);
  return {};
}

using Shape = std::vector<Dim>;

std::optional<Shape> ShapeOf(const TypeMap& types, const std::string& name) {
  const onnx::TypeProto* type = types.Find(name);
  if (type == nullptr || !type->tensor_type().has_shape()) return std::nullopt;
  Shape shape;
  for (const auto& d : type->tensor_type().shape().dim()) shape.push_back(FromProto(d));
  return shape;
}

std::optional<std::vector<int64_t>> Ints(const onnx::TensorProto& tensor) {
  if (tensor.data_type() == onnx::TensorProto::INT64) {
    if (tensor.has_raw_data()) {
      std::vector<int64_t> v(tensor.raw_data().size() / 8);
      std::memcpy(v.data(), tensor.raw_data().data(), v.size() * 8);
      return v;
    }
    return std::vector<int64_t>(tensor.int64_data().begin(), tensor.int64_data().end());
  }
  if (tensor.data_type() == onnx::TensorProto::INT32 && !tensor.has_raw_data()) {
    return std::vector<int64_t>(tensor.int32_data().begin(), tensor.int32_data().end());
  }
  return std::nullopt;
}

const std::set<std::string, std::less<>>& BroadcastOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{
      "Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "And", "Or", "Max", "Min"};
  return *ops;
}

// Node-based: rules copy one tracked value into another's slot, which must not move the first.
using Values = absl::node_hash_map<std::string, Shape>;

// A constant (initializer or Constant) small enough to be shape arithmetic, as its value.
void TrackTensor(const std::string& name, const onnx::TensorProto& tensor, Values* values) {
  if (tensor.dims_size() > 1 || tensor.data_location() == onnx::TensorProto::EXTERNAL) return;
  auto ints = Ints(tensor);
  if (!ints || ints->size() > 64) return;
  Shape shape;
  for (int64_t v : *ints) shape.push_back(Dim::Value(v));
  (*values)[name] = shape;
}

// The symbolic value of `node`'s first output where its rule and the values of its inputs fix it.
void TrackNode(const onnx::NodeProto& node, const TypeMap& types, int64_t opset, Values* tracked) {
  Values& values = *tracked;
  if (!node.domain().empty() && node.domain() != "ai.onnx") return;
  const absl::string_view op = node.op_type();
  auto input = [&](int i) -> const Shape* {
    if (i >= node.input_size()) return nullptr;
    auto it = values.find(node.input(i));
    return it == values.end() ? nullptr : &it->second;
  };
  if (node.output_size() < 1) return;
  const std::string& out = node.output(0);
  if (op == "Constant") {
    for (const auto& a : node.attribute()) {
      if (a.name() == "value" && a.has_t()) TrackTensor(out, a.t(), &values);
    }
  } else if (op == "Shape" && node.input_size() == 1) {
    auto shape = ShapeOf(types, node.input(0));
    if (!shape) return;
    const int64_t rank = static_cast<int64_t>(shape->size());
    int64_t start = opset >= 15 ? GetAttributeInt(node, "start", 0) : 0;
    int64_t end = opset >= 15 ? GetAttributeInt(node, "end", rank) : rank;
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    values[out] = Shape(shape->begin() + start, shape->begin() + end);
  } else if (op == "Cast" && input(0)) {
    // Casts that keep integer values as they are (not to bool, which would make 5 a 1).
    const int64_t to = GetAttributeInt(node, "to", 0);
    if (to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32 || to == onnx::TensorProto::FLOAT ||
        to == onnx::TensorProto::DOUBLE) {
      values[out] = *input(0);
    }
  } else if ((op == "Unsqueeze" || op == "Squeeze" || op == "Identity") && input(0)) {
    values[out] = *input(0);
  } else if (op == "Gather" && input(0) && input(1) && GetAttributeInt(node, "axis", 0) == 0) {
    Shape picked;
    for (const Dim& index : *input(1)) {
      if (index.kind != Dim::Kind::kValue) {
        picked.clear();
        break;
      }
      int64_t i = index.value < 0 ? index.value + static_cast<int64_t>(input(0)->size()) : index.value;
      if (i < 0 || i >= static_cast<int64_t>(input(0)->size())) {
        picked.clear();
        break;
      }
      picked.push_back((*input(0))[static_cast<size_t>(i)]);
    }
    if (!picked.empty()) values[out] = picked;
  } else if (op == "Slice" && input(0) && (node.input_size() >= 3 || node.input_size() == 1)) {
    // A slice of a shape tensor; before opset 10 (paddle2onnx's opset 9) its bounds are attributes.
    Shape attribute_starts, attribute_ends, attribute_axes;
    const bool attributes = node.input_size() == 1;
    for (const auto& a : node.attribute()) {
      Shape* target = a.name() == "starts" ? &attribute_starts
                      : a.name() == "ends" ? &attribute_ends
                      : a.name() == "axes" ? &attribute_axes
                                           : nullptr;
      if (target == nullptr || !attributes) continue;
      for (int64_t v : a.ints()) target->push_back(Dim::Value(v));
    }
    const bool has_axes = attributes ? !attribute_axes.empty() : node.input_size() > 3 && !node.input(3).empty();
    const Shape* starts = attributes ? &attribute_starts : input(1);
    const Shape* ends = attributes ? &attribute_ends : input(2);
    const Shape* axes = !has_axes ? nullptr : attributes ? &attribute_axes : input(3);
    const Shape* steps = !attributes && node.input_size() > 4 && !node.input(4).empty() ? input(4) : nullptr;
    if (!starts || !ends || starts->size() != 1 || ends->size() != 1 || (has_axes && !axes) ||
        (axes && !(axes->size() == 1 && ((*axes)[0] == Dim::Value(0) || (*axes)[0] == Dim::Value(-1)))) ||
        (steps && !(steps->size() == 1 && (*steps)[0] == Dim::Value(1))) ||
        (*starts)[0].kind != Dim::Kind::kValue || (*ends)[0].kind != Dim::Kind::kValue) {
      return;
    }
    const int64_t size = static_cast<int64_t>(input(0)->size());
    int64_t start = (*starts)[0].value, end = (*ends)[0].value;
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = std::clamp<int64_t>(start, 0, size);
    end = std::clamp<int64_t>(end, start, size);
    values[out] = Shape(input(0)->begin() + start, input(0)->begin() + end);
  } else if (op == "ConstantOfShape" && input(0) && input(0)->size() == 1 &&
             (*input(0))[0].kind == Dim::Kind::kValue && (*input(0))[0].value >= 0 &&
             (*input(0))[0].value <= 64) {
    // A small integer tensor filled with the attribute's value (0 if none).
    std::optional<int64_t> fill = 0;
    for (const auto& a : node.attribute()) {
      if (a.name() != "value" || !a.has_t()) continue;
      auto ints = Ints(a.t());
      fill = ints && ints->size() == 1 ? std::optional<int64_t>((*ints)[0]) : std::nullopt;
    }
    if (fill) values[out] = Shape(static_cast<size_t>((*input(0))[0].value), Dim::Value(*fill));
  } else if (op == "Equal" && input(0) && input(1) && input(0)->size() == input(1)->size()) {
    // Elementwise; a named dim is a size, never negative, so it differs from any negative number (as a
    // sum of sizes does).
    Shape result;
    for (size_t i = 0; i < input(0)->size(); ++i) {
      const Dim& a = (*input(0))[i];
      const Dim& b = (*input(1))[i];
      if (a.kind == Dim::Kind::kValue && b.kind == Dim::Kind::kValue) {
        result.push_back(Dim::Value(a.value == b.value ? 1 : 0));
      } else if (a.known() && b.known() && a == b) {
        result.push_back(Dim::Value(1));
      } else if ((NonNegative(a) && b.kind == Dim::Kind::kValue && b.value < 0) ||
                 (NonNegative(b) && a.kind == Dim::Kind::kValue && a.value < 0)) {
        result.push_back(Dim::Value(0));
      } else {
        result.push_back({});
      }
    }
    values[out] = result;
  } else if (op == "Where" && input(0) && input(1) && input(2) && input(0)->size() == input(1)->size() &&
             input(1)->size() == input(2)->size()) {
    Shape result;
    for (size_t i = 0; i < input(0)->size(); ++i) {
      const Dim& c = (*input(0))[i];
      result.push_back(c.kind != Dim::Kind::kValue ? Dim() : (c.value != 0 ? (*input(1))[i] : (*input(2))[i]));
    }
    values[out] = result;
  } else if (op == "Concat") {
    Shape joined;
    bool complete = true;
    for (int i = 0; i < node.input_size() && complete; ++i) {
      if (const Shape* part = input(i)) {
        joined.insert(joined.end(), part->begin(), part->end());
      } else {
        complete = false;
      }
    }
    if (complete) values[out] = joined;
  } else if ((op == "Mul" || op == "Add" || op == "Sub" || op == "Div") && input(0) && input(1) &&
             input(0)->size() == input(1)->size()) {
    Shape result;
    for (size_t i = 0; i < input(0)->size(); ++i) {
      const Dim& a = (*input(0))[i];
      const Dim& b = (*input(1))[i];
      if (a.kind == Dim::Kind::kValue && b.kind == Dim::Kind::kValue && (op == "Mul" || op == "Div")) {
        if (op == "Mul") result.push_back(Dim::Value(a.value * b.value));
        if (op == "Div") result.push_back(b.value == 0 ? Dim() : Dim::Value(a.value / b.value));
      } else if ((op == "Add" || op == "Sub") && a.known() && b.known()) {
        // One symbolic name is one size (ONNX's rule for dim_param): key_length - query_length is 0,
        // past + sequence the key length a Concat of the past and the new keys has.
        result.push_back(FromSum(SumOf(a)->Plus(*SumOf(b), op == "Add" ? 1 : -1)));
      } else if (op == "Mul" && a.kind == Dim::Kind::kParam && b == Dim::Value(1)) {
        result.push_back(a);
      } else if (op == "Div" && a.kind == Dim::Kind::kParam && b.kind == Dim::Kind::kValue) {
        result.push_back(b.value == 1 ? a : DivideSum(a, b.value));
      } else {
        result.push_back({});
      }
    }
    values[out] = result;
  }
}

// A better type for `name` from `shape` if it knows more than `types` does; true if updated.
bool Improve(TypeMap* types, const std::string& name, const Shape& shape,
             int32_t element_type) {
  auto* tensor = types->GetOrAdd(name)->mutable_tensor_type();
  if (tensor->elem_type() == 0 && element_type != 0) tensor->set_elem_type(element_type);
  if (tensor->has_shape() && tensor->shape().dim_size() != static_cast<int>(shape.size())) return false;
  bool improved = false;
  if (!tensor->has_shape()) {
    for (size_t i = 0; i < shape.size(); ++i) tensor->mutable_shape()->add_dim();
    improved = true;
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    auto* d = tensor->mutable_shape()->mutable_dim(static_cast<int>(i));
    if (FromProto(*d).known() || !shape[i].known()) continue;
    ToProto(shape[i], d);
    improved = true;
  }
  return improved;
}

int32_t ElementType(const TypeMap& types, const std::string& name) {
  const onnx::TypeProto* type = types.Find(name);
  return type == nullptr ? 0 : type->tensor_type().elem_type();
}

// Operators onnx 1.12 has no schema for here (ONNX Runtime's fused ones, LayerNormalization below
// opset 17) whose first output has the shape of their first input (GroupQueryAttention's as the fusion
// writes it: Q, K and V not packed).
bool KeepsInputShape(const onnx::NodeProto& node) {
  static const auto* microsoft = new std::set<std::string>{
      "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "SkipLayerNormalization", "LayerNormalization",
      "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "BiasAdd", "RotaryEmbedding",
      "GroupQueryAttention"};
  if (node.domain() == "com.microsoft") return microsoft->count(node.op_type()) > 0;
  return (node.domain().empty() || node.domain() == "ai.onnx") &&
         (node.op_type() == "LayerNormalization" || node.op_type() == "SimplifiedLayerNormalization");
}

// `named` (a declared dim) is `sum`: learned as an alias where `named` is a plain name that `sum` is
// not and does not hold, and it has none yet.
void LearnAlias(const Dim& named, const DimSum& sum, DimAliases* learned) {
  if (named.kind != Dim::Kind::kParam || named.param.find(' ') != std::string::npos || sum.IsNumber() ||
      sum.terms.count(named.param) > 0) {
    return;
  }
  learned->emplace(named.param, sum.Spell());
}

// Better output types for `node` from its rule, the types of its inputs and the tracked values;
// the number of outputs improved.
int ImproveNode(const onnx::NodeProto& node, const Values& values, TypeMap* types, DimAliases* learned) {
  int improved = 0;
  if (KeepsInputShape(node) && node.input_size() >= 1 && node.output_size() >= 1) {
    if (auto shape = ShapeOf(*types, node.input(0))) {
      improved += Improve(types, node.output(0), *shape, ElementType(*types, node.input(0)));
      // Skip(Simplified)LayerNormalization's 4th output, input + skip + bias, has the input's shape too.
      if (node.output_size() >= 4 && !node.output(3).empty()) {
        improved += Improve(types, node.output(3), *shape, ElementType(*types, node.input(0)));
      }
    }
    return improved;
  }
  if (node.domain() == "com.microsoft" && node.op_type() == "Attention" && node.input_size() >= 2) {
    // [B, S, W/3] for weights W[H_in, 3 * H] (no qkv_hidden_sizes).
    auto shape = ShapeOf(*types, node.input(0));
    auto weights = ShapeOf(*types, node.input(1));
    if (shape && shape->size() == 3 && weights && weights->size() == 2 && (*weights)[1].kind == Dim::Kind::kValue &&
        (*weights)[1].value % 3 == 0) {
      (*shape)[2] = Dim::Value((*weights)[1].value / 3);
      improved += Improve(types, node.output(0), *shape, ElementType(*types, node.input(0)));
    }
    return improved;
  }
  if (node.domain() == "com.microsoft" && node.op_type() == "EmbedLayerNormalization" && node.input_size() >= 3) {
    // [B, S, H] from the ids [B, S] and the word table [V, H]; mask_index [B].
    auto ids = ShapeOf(*types, node.input(0));
    auto table = ShapeOf(*types, node.input(2));
    if (ids && ids->size() == 2 && table && table->size() == 2) {
      const Shape shape = {(*ids)[0], (*ids)[1], (*table)[1]};
      const int32_t element_type = ElementType(*types, node.input(2));
      improved += Improve(types, node.output(0), shape, element_type);
      if (node.output_size() >= 2 && !node.output(1).empty()) {
        improved += Improve(types, node.output(1), Shape{(*ids)[0]}, onnx::TensorProto::INT32);
      }
      if (node.output_size() >= 3 && !node.output(2).empty()) improved += Improve(types, node.output(2), shape, element_type);
    }
    return improved;
  }
  if ((!node.domain().empty() && node.domain() != "ai.onnx") || node.output_size() < 1) return improved;
  const absl::string_view op = node.op_type();
  const std::string& out = node.output(0);
  if (op == "Range" && node.input_size() == 3) {
    // Range(a, b, 1) has b - a elements (Range(past, past + sequence, 1): sequence).
    auto start = values.find(node.input(0));
    auto limit = values.find(node.input(1));
    auto delta = values.find(node.input(2));
    if (start == values.end() || limit == values.end() || delta == values.end() || start->second.size() != 1 ||
        limit->second.size() != 1 || delta->second.size() != 1 || !(delta->second[0] == Dim::Value(1)) ||
        !start->second[0].known() || !limit->second[0].known()) {
      return improved;
    }
    const Dim length = FromSum(SumOf(limit->second[0])->Plus(*SumOf(start->second[0]), -1));
    if (!NonNegative(length)) return improved;  // b < a gives no elements: only a size is a length
    improved += Improve(types, out, Shape{length}, ElementType(*types, node.input(0)));
    return improved;
  }
  if (op == "Concat" && node.input_size() >= 1) {
    // The joined axis is the sum of the inputs' (onnx leaves it unknown where one is symbolic).
    std::optional<Shape> first = ShapeOf(*types, node.input(0));
    if (!first || first->empty()) return improved;
    const int64_t rank = static_cast<int64_t>(first->size());
    int64_t axis = GetAttributeInt(node, "axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return improved;
    DimSum total;
    for (int i = 0; i < node.input_size(); ++i) {
      std::optional<Shape> shape = ShapeOf(*types, node.input(i));
      if (!shape || static_cast<int64_t>(shape->size()) != rank) return improved;
      std::optional<DimSum> part = SumOf((*shape)[static_cast<size_t>(axis)]);
      if (!part) return improved;
      total = total.Plus(*part);
    }
    Shape result(first->size());
    result[static_cast<size_t>(axis)] = FromSum(total);
    // A declared name for a sum of other names is an alias of the sum (not of a sum holding itself).
    if (std::optional<Shape> declared = ShapeOf(*types, out);
        declared && declared->size() == first->size() && total.terms.size() + (total.constant != 0) > 1) {
      LearnAlias((*declared)[static_cast<size_t>(axis)], total, learned);
    }
    improved += Improve(types, out, result, ElementType(*types, node.input(0)));
    return improved;
  }
  if (op == "Expand" && node.input_size() == 2) {
    // Broadcast of the input's shape with the (tracked) target shape; a 1 keeps the input's dim.
    auto target = values.find(node.input(1));
    auto input = ShapeOf(*types, node.input(0));
    if (target == values.end() || !input) return improved;
    const size_t rank = std::max(target->second.size(), input->size());
    Shape result(rank);
    for (size_t d = 0; d < rank; ++d) {
      const size_t ti = d + target->second.size() - rank, ii = d + input->size() - rank;
      const Dim t = d + target->second.size() >= rank ? target->second[ti] : Dim::Value(1);
      const Dim i = d + input->size() >= rank ? (*input)[ii] : Dim::Value(1);
      if (t == Dim::Value(1)) {
        result[d] = i;
      } else if (i == Dim::Value(1) || i == t) {
        result[d] = t;
      }
    }
    improved += Improve(types, out, result, ElementType(*types, node.input(0)));
    return improved;
  }
  if (op == "Reshape" && node.input_size() == 2) {
    auto target = values.find(node.input(1));
    auto input = ShapeOf(*types, node.input(0));
    if (target == values.end()) return improved;
    const bool allow_zero = GetAttributeInt(node, "allowzero", 0) != 0;
    Shape result;
    int infer_at = -1;
    for (size_t i = 0; i < target->second.size(); ++i) {
      const Dim& d = target->second[i];
      if (d.kind == Dim::Kind::kValue && d.value == 0 && !allow_zero) {
        result.push_back(input && i < input->size() ? (*input)[i] : Dim());
      } else if (d.kind == Dim::Kind::kValue && d.value == -1) {
        infer_at = static_cast<int>(i);
        result.push_back({});
      } else {
        result.push_back(d);
      }
    }
    if (infer_at >= 0 && input) {
      Monomial total, others;
      bool ok = true;
      for (const Dim& d : *input) ok &= total.Multiply(d);
      for (size_t i = 0; i < result.size(); ++i) {
        if (static_cast<int>(i) != infer_at) ok &= others.Multiply(result[i]);
      }
      if (ok) result[static_cast<size_t>(infer_at)] = Divide(total, others);
    }
    if (infer_at >= 0 && !result[static_cast<size_t>(infer_at)].known()) {
      // The dim -1 leaves is one size wherever this output goes (a flattening Reshape after
      // convolutions whose sizes onnx cannot work out): a name of its own lets "same dim" checks
      // downstream (residuals, head splits by Shape of it) see that.
      result[static_cast<size_t>(infer_at)] = Dim::Param(absl::StrCat(out, ":", infer_at));
    }
    improved += Improve(types, out, result, ElementType(*types, node.input(0)));
  } else if (op == "Slice" && node.input_size() >= 3) {
    // Same rank as the input; a sliced dim (step 1) is end - start: known numbers clamped to a known
    // dim, a start or end past the dim's end the dim itself, and symbolic bounds (lengths the graph
    // computes: a table of positions cut to the sequence, `pe[:, c - T + 1 : c + T]`) taken within it.
    auto input = ShapeOf(*types, node.input(0));
    if (!input) return improved;
    auto get = [&](int i) -> const Shape* {
      if (i >= node.input_size() || node.input(i).empty()) return nullptr;
      auto it = values.find(node.input(i));
      return it == values.end() ? nullptr : &it->second;
    };
    const Shape* starts = get(1);
    const Shape* ends = get(2);
    const Shape* axes = get(3);
    const Shape* steps = get(4);
    Shape result = *input;
    const int64_t rank = static_cast<int64_t>(input->size());
    const size_t count = starts ? starts->size() : 0;
    for (size_t k = 0; k < std::max<size_t>(count, 1); ++k) {
      int64_t axis = static_cast<int64_t>(k);
      if (axes != nullptr) {
        if (k >= axes->size() || (*axes)[k].kind != Dim::Kind::kValue) {
          result.assign(input->size(), Dim());  // unknown axes: only the rank is certain
          break;
        }
        axis = (*axes)[k].value < 0 ? (*axes)[k].value + rank : (*axes)[k].value;
      }
      if (axis < 0 || axis >= rank) break;
      if (!starts) {
        result.assign(input->size(), Dim());
        break;
      }
      const bool unit_step = !steps || (k < steps->size() && (*steps)[k] == Dim::Value(1));
      result[static_cast<size_t>(axis)] =
          unit_step && ends && k < ends->size()
              ? SlicedLength((*input)[static_cast<size_t>(axis)], (*starts)[k], (*ends)[k])
              : Dim();
    }
    improved += Improve(types, out, result, ElementType(*types, node.input(0)));
  } else if (BroadcastOps().count(op) > 0) {
    std::vector<Shape> inputs;
    size_t rank = 0;
    bool all_ranked = true;
    for (int i = 0; i < node.input_size() && all_ranked; ++i) {
      auto shape = ShapeOf(*types, node.input(i));
      if (!shape) {
        all_ranked = false;
      } else {
        rank = std::max(rank, shape->size());
        inputs.push_back(*shape);
      }
    }
    if (!all_ranked || inputs.empty()) return improved;
    Shape result(rank);
    for (size_t d = 0; d < rank; ++d) {
      std::optional<Dim> chosen;
      bool conflict = false, any_unknown = false, all_one = true;
      for (const Shape& shape : inputs) {
        const size_t offset = rank - shape.size();
        if (d < offset) continue;  // broadcasts as 1
        const Dim& dim = shape[d - offset];
        if (!dim.known()) {
          any_unknown = true;
          all_one = false;
          continue;
        }
        if (dim == Dim::Value(1)) continue;
        all_one = false;
        if (!chosen) {
          chosen = dim;
        } else if (!(*chosen == dim)) {
          conflict = true;
        }
      }
      if (conflict) continue;
      if (chosen) {
        result[d] = *chosen;
      } else if (all_one && !any_unknown) {
        result[d] = Dim::Value(1);
      }
    }
    const int32_t element_type = op == "Equal" || op == "Less" || op == "Greater" || op == "And" || op == "Or"
                                     ? onnx::TensorProto::BOOL
                                     : ElementType(*types, node.input(op == "Where" ? 1 : 0));
    improved += Improve(types, out, result, element_type);
  }
  return improved;
}

}  // namespace

struct SymbolicShapes::State {
  Values values;
  DimAliases learned_aliases;
  // The tracked node outputs, in the order they were computed (the map's entries do not move).
  std::vector<const Values::value_type*> computed;
};

SymbolicShapes::SymbolicShapes(int64_t opset) : opset_(opset), state_(std::make_unique<State>()) {}
SymbolicShapes::~SymbolicShapes() = default;

void SymbolicShapes::TrackConstant(const std::string& name, const onnx::TensorProto& tensor) {
  TrackTensor(name, tensor, &state_->values);
}

int SymbolicShapes::Apply(const onnx::NodeProto& node, TypeMap* types) {
  const int improved = ImproveNode(node, state_->values, types, &state_->learned_aliases);
  TrackNode(node, *types, opset_, &state_->values);
  // Only computed values are worth reporting as known: a Constant is one already.
  if (absl::string_view(node.op_type()) != "Constant" && node.output_size() == 1) {
    auto it = state_->values.find(node.output(0));
    if (it != state_->values.end()) state_->computed.push_back(&*it);
  }
  return improved;
}

bool SymbolicShapes::ShapeData(const std::string& name, onnx::TensorShapeProto* data) const {
  auto it = state_->values.find(name);
  if (it == state_->values.end()) return false;
  data->Clear();
  for (const Dim& d : it->second) ToProto(d, data->add_dim());
  return true;
}

void SymbolicShapes::AddKnown(KnownIntValues* known) const {
  known->reserve(known->size() + state_->computed.size());
  for (const Values::value_type* entry : state_->computed) {
    const auto& [name, value] = *entry;
    std::vector<onnx::TensorShapeProto::Dimension> dims;
    for (const Dim& d : value) {
      if (!d.known()) break;
      ToProto(d, &dims.emplace_back());
    }
    if (dims.size() == value.size()) (*known)[name] = std::move(dims);
  }
}

const DimAliases& SymbolicShapes::learned_aliases() const { return state_->learned_aliases; }

void SymbolicShapes::NoteDeclaredDim(const onnx::TensorShapeProto::Dimension& declared,
                                     const onnx::TensorShapeProto::Dimension& computed) {
  const Dim computed_dim = FromProto(computed);
  if (computed_dim.kind != Dim::Kind::kParam) return;
  LearnAlias(FromProto(declared), DimSum::Parse(computed_dim.param), &state_->learned_aliases);
}

}  // namespace onnxopt
