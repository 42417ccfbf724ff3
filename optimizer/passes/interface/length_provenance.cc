#include "optimizer/passes/interface/length_provenance.h"

#include <algorithm>
#include <numeric>

#include "absl/container/node_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"

namespace onnxopt {
namespace {

// A dim (or a shape tensor's element) as traced: its value at the exported length (-1 unknown) and
// its variable (-1: no provenance).
struct Dim {
  int64_t value = -1;
  int var = -1;
};
using Dims = std::vector<Dim>;

constexpr size_t kMaxTrackedElements = 64;  // integer constants up to this size are shape values

struct Origin {
  enum Kind { kInput, kElement, kDim, kDerived } kind = kDerived;
  ConstantRead read;
  int index = 0;
  int freed = -1;
};

// Operators whose first output has their first input's shape.
// clang-format off
constexpr absl::string_view kSameShape[] = {
    "Identity", "Cast", "Relu", "Erf", "Tanh", "Sigmoid", "Sqrt", "Neg", "Not", "Abs", "Exp", "Log", "Softmax",
    "LogSoftmax", "IsNaN", "IsInf", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Dropout", "Clip", "Trilu",
    "Softplus", "Elu", "LeakyRelu", "HardSigmoid", "Sin", "Cos", "CumSum", "InstanceNormalization",
    "BatchNormalization"};
// clang-format on
// Operators that broadcast their inputs against each other.
constexpr absl::string_view kBroadcasting[] = {
    "Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Greater", "Less",  "GreaterOrEqual", "LessOrEqual",
    "And", "Or",  "Xor", "Max", "Min", "Mod",   "Sum",   "Mean",    "PRelu", "BitShift"};

template <size_t N>
bool IsAny(absl::string_view op, const absl::string_view (&ops)[N]) {
  return std::find(std::begin(ops), std::end(ops), op) != std::end(ops);
}
bool IsAny(absl::string_view op, std::initializer_list<absl::string_view> ops) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

int64_t NormalizeAxis(int64_t axis, size_t rank) { return axis < 0 ? axis + static_cast<int64_t>(rank) : axis; }

class Tracer {
 public:
  Tracer(const Graph& graph, const std::vector<FreedDim>& dims) : graph_(graph), dims_(dims) {}

  LengthProvenance Run() {
    for (const auto& input : graph_.proto().input()) {
      if (graph_.Initializer(input.name()) != nullptr || !input.type().has_tensor_type()) continue;
      Dims shape;
      const auto& declared = input.type().tensor_type().shape();
      for (int d = 0; d < declared.dim_size(); ++d) {
        Dim dim{declared.dim(d).has_dim_value() ? declared.dim(d).dim_value() : -1, -1};
        for (size_t k = 0; k < dims_.size(); ++k) {
          if (dims_[k].input == input.name() && dims_[k].axis == d) {
            dim = Dim{dims_[k].length, NewVar(Origin{Origin::kInput, {}, d, static_cast<int>(k)})};
          }
        }
        shape.push_back(dim);
      }
      shapes_[input.name()] = std::move(shape);
    }
    for (Node* node : graph_.Nodes()) Visit(node);
    return Collect();
  }

 private:
  int NewVar(Origin origin) {
    parent_.push_back(static_cast<int>(parent_.size()));
    origins_.push_back(origin);
    return parent_.back();
  }
  int Find(int var) {
    while (parent_[var] != var) var = parent_[var] = parent_[parent_[var]];
    return var;
  }
  // The two dims must be one: their variables join.
  void Unify(const Dim& a, const Dim& b) {
    if (a.var < 0 || b.var < 0 || a.value != b.value) return;
    parent_[Find(a.var)] = Find(b.var);
  }
  bool IsLength(int64_t value) const {
    return std::any_of(dims_.begin(), dims_.end(), [&](const FreedDim& dim) { return dim.length == value; });
  }
  // A dim computed from others (a Reshape's -1, a flattened product): a variable of its own when its
  // value could be the length, for the rules downstream to join.
  Dim Derived(int64_t value) { return Dim{value, IsLength(value) ? NewVar(Origin{}) : -1}; }

  // Input `slot` of `node`: its traced shape, or for a constant the constant's, with a fresh variable
  // for each dim equal to a length (this read's own).
  const Dims* ShapeOf(Node* node, int slot) {
    if (slot >= node->input_size() || node->input(slot).empty()) return nullptr;
    const std::string& name = node->input(slot);
    if (const onnx::TensorProto* tensor = ConstantTensor(graph_, name)) {
      const ConstantRead read{node, slot};
      auto [it, added] = read_shapes_.emplace(read, Dims());
      if (added) {
        for (int d = 0; d < tensor->dims_size(); ++d) {
          const int64_t value = tensor->dims(d);
          it->second.push_back(Dim{value, IsLength(value) ? NewVar(Origin{Origin::kDim, read, d}) : -1});
        }
      }
      return &it->second;
    }
    auto it = shapes_.find(name);
    return it == shapes_.end() ? nullptr : &it->second;
  }
  // Input `slot`'s elements, where it is a small integer tensor whose values are known.
  const Dims* ValueOf(Node* node, int slot) {
    if (slot >= node->input_size() || node->input(slot).empty()) return nullptr;
    const std::string& name = node->input(slot);
    if (const onnx::TensorProto* tensor = ConstantTensor(graph_, name)) {
      const ConstantRead read{node, slot};
      auto [it, added] = read_values_.emplace(read, Dims());
      if (added) {
        std::optional<std::vector<int64_t>> ints = TensorInts(*tensor);
        if (!ints || ints->size() > kMaxTrackedElements || tensor->dims_size() > 1) {
          read_values_.erase(it);
          return nullptr;
        }
        for (size_t i = 0; i < ints->size(); ++i) {
          const int64_t value = (*ints)[i];
          it->second.push_back(
              Dim{value, IsLength(value) ? NewVar(Origin{Origin::kElement, read, static_cast<int>(i)}) : -1});
        }
      }
      return &it->second;
    }
    auto it = values_.find(name);
    return it == values_.end() ? nullptr : &it->second;
  }
  std::optional<std::vector<int64_t>> Numbers(Node* node, int slot) {
    const Dims* value = ValueOf(node, slot);
    if (value == nullptr) return std::nullopt;
    std::vector<int64_t> numbers;
    for (const Dim& dim : *value) numbers.push_back(dim.value);
    return numbers;
  }
  std::optional<std::vector<int64_t>> Axes(Node* node, int slot) {
    if (const onnx::AttributeProto* attribute = node->FindAttribute("axes")) {
      return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
    }
    return Numbers(node, slot);
  }

  // Numpy broadcasting of `shapes`, joining the dims that meet (non-1 on both sides).
  Dims Broadcast(const std::vector<const Dims*>& shapes) {
    size_t rank = 0;
    for (const Dims* shape : shapes) rank = std::max(rank, shape->size());
    Dims out(rank, Dim{1, -1});
    for (size_t axis = 0; axis < rank; ++axis) {
      const Dim* chosen = nullptr;
      for (const Dims* shape : shapes) {
        if (axis + shape->size() < rank) continue;
        const Dim& dim = (*shape)[axis + shape->size() - rank];
        if (dim.value == 1) continue;
        if (chosen == nullptr) {
          chosen = &dim;
        } else {
          Unify(*chosen, dim);
          if (chosen->var < 0) chosen = &dim;
        }
      }
      if (chosen != nullptr) out[axis] = *chosen;
    }
    return out;
  }

  // A Reshape or Flatten: dims that keep their place (equal products on both sides, 1s aside) are one.
  void AlignKeptDims(const Dims& in, const Dims& out) {
    Dims a, b;
    for (const Dim& dim : in) {
      if (dim.value < 0) return;
      if (dim.value != 1) a.push_back(dim);
    }
    for (const Dim& dim : out) {
      if (dim.value < 0) return;
      if (dim.value != 1) b.push_back(dim);
    }
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
      const size_t group_i = i, group_j = j;
      int64_t left = a[i].value, right = b[j].value;
      while (left != right) {
        if (left < right) {
          if (++i >= a.size()) return;
          left *= a[i].value;
        } else {
          if (++j >= b.size()) return;
          right *= b[j].value;
        }
      }
      if (i == group_i && j == group_j) Unify(a[i], b[j]);
      ++i;
      ++j;
    }
  }

  static int64_t Product(const Dims& dims, size_t begin, size_t end) {
    int64_t product = 1;
    for (size_t i = begin; i < end; ++i) {
      if (dims[i].value < 0) return -1;
      product *= dims[i].value;
    }
    return product;
  }

  void SetShape(Node* node, int output, Dims shape) {
    if (output < node->output_size() && !node->output(output).empty()) shapes_[node->output(output)] = std::move(shape);
  }
  void SetValue(Node* node, int output, Dims value) {
    if (output < node->output_size() && !node->output(output).empty()) values_[node->output(output)] = std::move(value);
  }

  // One rule an operator kind; anything else leaves its outputs unknown (what they meet is decided
  // by the rest of the graph).
  void Visit(Node* node) {
    if (!node->domain().empty() || !node->subgraphs().empty()) return;
    const absl::string_view op = node->op_type();
    if (op == "Constant") return;
    const Dims* in = ShapeOf(node, 0);
    if (op == "Shape") return VisitShape(node, in);
    if (IsAny(op, kSameShape)) return VisitElementwise(node, in);
    if (op == "LayerNormalization") return VisitLayerNormalization(node, in);
    if (IsAny(op, kBroadcasting)) return VisitBroadcast(node, in);
    if (op == "MatMul") return VisitMatMul(node, in);
    if (op == "Gemm") return VisitGemm(node, in);
    if (op == "Transpose") return VisitTranspose(node, in);
    if (op == "Reshape") return VisitReshape(node, in);
    if (op == "Flatten") return VisitFlatten(node, in);
    if (op == "Unsqueeze" || op == "Squeeze") return VisitUnsqueezeOrSqueeze(node, in);
    if (op == "Concat") return VisitConcat(node, in);
    if (op == "Gather") return VisitGather(node, in);
    if (op == "Slice") return VisitSlice(node, in);
    if (op == "Expand") return VisitExpand(node, in);
    if (op == "ConstantOfShape") return VisitConstantOfShape(node, in);
    if (op == "Range") return VisitRange(node, in);
    if (op == "Tile") return VisitTile(node, in);
    if (op == "Split") return VisitSplit(node, in);
    if (absl::StartsWith(op, "Reduce") || op == "ArgMax" || op == "ArgMin") return VisitReduce(node, in);
  }

  void VisitShape(Node* node, const Dims* in) {
    if (in == nullptr) return;
    const int64_t rank = static_cast<int64_t>(in->size());
    int64_t start = NormalizeAxis(node->GetAttributeInt("start", 0), in->size());
    int64_t end = NormalizeAxis(node->GetAttributeInt("end", rank), in->size());
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    SetValue(node, 0, Dims(in->begin() + start, in->begin() + end));
    SetShape(node, 0, {Dim{end - start, -1}});
  }

  void VisitElementwise(Node* node, const Dims* in) {
    const absl::string_view op = node->op_type();
    if (in == nullptr) return;
    SetShape(node, 0, *in);
    if (IsAny(op, {"Identity", "Cast"})) {
      if (const Dims* value = ValueOf(node, 0)) SetValue(node, 0, *value);
    }
  }

  void VisitLayerNormalization(Node* node, const Dims* in) {
    if (in == nullptr) return;
    for (int slot = 1; slot < node->input_size(); ++slot) {
      if (const Dims* scale = ShapeOf(node, slot)) Broadcast({in, scale});
    }
    SetShape(node, 0, *in);
  }

  void VisitBroadcast(Node* node, const Dims* in) {
    std::vector<const Dims*> shapes;
    for (int slot = 0; slot < node->input_size(); ++slot) {
      const Dims* shape = ShapeOf(node, slot);
      if (shape == nullptr) return;
      shapes.push_back(shape);
    }
    SetShape(node, 0, Broadcast(shapes));
  }

  void VisitMatMul(Node* node, const Dims* in) {
    const Dims* b = ShapeOf(node, 1);
    if (in == nullptr || b == nullptr || in->empty() || b->empty()) return;
    Dims a_batch, b_batch;
    Dim m{1, -1}, n{1, -1};
    const Dim k_a = in->back();
    const Dim k_b = b->size() >= 2 ? (*b)[b->size() - 2] : b->back();
    Unify(k_a, k_b);
    if (in->size() >= 2) {
      m = (*in)[in->size() - 2];
      a_batch.assign(in->begin(), in->end() - 2);
    }
    if (b->size() >= 2) {
      n = b->back();
      b_batch.assign(b->begin(), b->end() - 2);
    }
    Dims out = Broadcast({&a_batch, &b_batch});
    if (in->size() >= 2) out.push_back(m);
    if (b->size() >= 2) out.push_back(n);
    SetShape(node, 0, out);
  }

  void VisitGemm(Node* node, const Dims* in) {
    const Dims* b = ShapeOf(node, 1);
    if (in == nullptr || b == nullptr || in->size() != 2 || b->size() != 2) return;
    const bool trans_a = node->GetAttributeInt("transA", 0) != 0, trans_b = node->GetAttributeInt("transB", 0) != 0;
    Unify((*in)[trans_a ? 0 : 1], (*b)[trans_b ? 1 : 0]);
    Dims out = {(*in)[trans_a ? 1 : 0], (*b)[trans_b ? 0 : 1]};
    if (const Dims* c = ShapeOf(node, 2)) Broadcast({&out, c});
    SetShape(node, 0, out);
  }

  void VisitTranspose(Node* node, const Dims* in) {
    if (in == nullptr) return;
    Dims out;
    const onnx::AttributeProto* perm = node->FindAttribute("perm");
    for (size_t i = 0; i < in->size(); ++i) {
      const int64_t from = perm != nullptr && static_cast<int>(i) < perm->ints_size()
                               ? perm->ints(static_cast<int>(i))
                               : static_cast<int64_t>(in->size() - 1 - i);
      if (from < 0 || from >= static_cast<int64_t>(in->size())) return;
      out.push_back((*in)[static_cast<size_t>(from)]);
    }
    SetShape(node, 0, out);
  }

  void VisitReshape(Node* node, const Dims* in) {
    const Dims* target = ValueOf(node, 1);
    if (target == nullptr) return;
    if (const Dims* value = ValueOf(node, 0)) SetValue(node, 0, *value);
    if (in == nullptr) return;
    const bool allow_zero = node->GetAttributeInt("allowzero", 0) != 0;
    Dims out;
    int inferred = -1;
    for (size_t i = 0; i < target->size(); ++i) {
      const Dim& element = (*target)[i];
      if (element.value == 0 && !allow_zero) {
        if (i >= in->size()) return;
        out.push_back((*in)[i]);
      } else if (element.value == -1) {
        inferred = static_cast<int>(i);
        out.push_back(Dim{-1, -1});
      } else {
        out.push_back(element);
      }
    }
    if (inferred >= 0) {
      const int64_t total = Product(*in, 0, in->size());
      int64_t known = 1;
      for (size_t i = 0; i < out.size(); ++i) {
        if (static_cast<int>(i) != inferred) known *= out[i].value;
      }
      if (total < 0 || known <= 0) return;
      out[static_cast<size_t>(inferred)] = Derived(total / known);
    }
    AlignKeptDims(*in, out);
    SetShape(node, 0, out);
  }

  void VisitFlatten(Node* node, const Dims* in) {
    if (in == nullptr) return;
    const size_t axis = static_cast<size_t>(std::clamp<int64_t>(
        NormalizeAxis(node->GetAttributeInt("axis", 1), in->size()), 0, static_cast<int64_t>(in->size())));
    Dims out = {Derived(Product(*in, 0, axis)), Derived(Product(*in, axis, in->size()))};
    AlignKeptDims(*in, out);
    SetShape(node, 0, out);
  }

  void VisitUnsqueezeOrSqueeze(Node* node, const Dims* in) {
    const absl::string_view op = node->op_type();
    std::optional<std::vector<int64_t>> axes = Axes(node, 1);
    const Dims* value = ValueOf(node, 0);
    if (value != nullptr) SetValue(node, 0, *value);
    if (in == nullptr) return;
    Dims out = *in;
    if (op == "Unsqueeze") {
      if (!axes) return;
      const size_t rank = in->size() + axes->size();
      std::vector<int64_t> sorted;
      for (int64_t axis : *axes) sorted.push_back(NormalizeAxis(axis, rank));
      std::sort(sorted.begin(), sorted.end());
      for (int64_t axis : sorted) {
        if (axis < 0 || axis > static_cast<int64_t>(out.size())) return;
        out.insert(out.begin() + axis, Dim{1, -1});
      }
    } else {
      Dims kept;
      for (size_t i = 0; i < in->size(); ++i) {
        const bool squeezed = axes ? std::count_if(axes->begin(), axes->end(),
                                                   [&](int64_t axis) {
                                                     return NormalizeAxis(axis, in->size()) == static_cast<int64_t>(i);
                                                   }) > 0
                                   : (*in)[i].value == 1;
        if (!squeezed) kept.push_back((*in)[i]);
      }
      out = kept;
    }
    SetShape(node, 0, out);
  }

  void VisitConcat(Node* node, const Dims* in) {
    std::vector<const Dims*> shapes;
    Dims joined_value;
    bool values_known = true;
    for (int slot = 0; slot < node->input_size(); ++slot) {
      const Dims* shape = ShapeOf(node, slot);
      if (shape == nullptr) return;
      shapes.push_back(shape);
      const Dims* value = ValueOf(node, slot);
      if (value == nullptr) {
        values_known = false;
      } else {
        joined_value.insert(joined_value.end(), value->begin(), value->end());
      }
    }
    if (values_known) SetValue(node, 0, joined_value);
    const int64_t axis = NormalizeAxis(node->GetAttributeInt("axis", 0), shapes[0]->size());
    Dims out = *shapes[0];
    int64_t total = 0;
    int nonempty = 0;
    Dim only;
    for (const Dims* shape : shapes) {
      if (shape->size() != out.size() || axis < 0 || axis >= static_cast<int64_t>(out.size())) return;
      for (size_t d = 0; d < out.size(); ++d) {
        if (static_cast<int64_t>(d) != axis) Unify(out[d], (*shape)[d]);
      }
      const Dim& part = (*shape)[static_cast<size_t>(axis)];
      if (part.value < 0) return;
      total += part.value;
      if (part.value > 0) {
        ++nonempty;
        only = part;
      }
    }
    out[static_cast<size_t>(axis)] = nonempty == 1 ? only : Derived(total);
    SetShape(node, 0, out);
  }

  void VisitGather(Node* node, const Dims* in) {
    const Dims* indices = ShapeOf(node, 1);
    if (in == nullptr || indices == nullptr) return;
    const int64_t axis = NormalizeAxis(node->GetAttributeInt("axis", 0), in->size());
    if (axis < 0 || axis >= static_cast<int64_t>(in->size())) return;
    Dims out(in->begin(), in->begin() + axis);
    out.insert(out.end(), indices->begin(), indices->end());
    out.insert(out.end(), in->begin() + axis + 1, in->end());
    SetShape(node, 0, out);
    const Dims* value = ValueOf(node, 0);
    std::optional<std::vector<int64_t>> picked = Numbers(node, 1);
    if (value != nullptr && picked && axis == 0) {
      Dims selected;
      for (int64_t index : *picked) {
        const int64_t at = index < 0 ? index + static_cast<int64_t>(value->size()) : index;
        if (at < 0 || at >= static_cast<int64_t>(value->size())) return;
        selected.push_back((*value)[static_cast<size_t>(at)]);
      }
      SetValue(node, 0, selected);
    }
  }

  void VisitSlice(Node* node, const Dims* in) {
    const Dims* starts = ValueOf(node, 1);
    const Dims* ends = ValueOf(node, 2);
    if (in == nullptr || starts == nullptr || ends == nullptr || starts->size() != ends->size()) return;
    std::vector<int64_t> axes(starts->size()), steps(starts->size(), 1);
    std::iota(axes.begin(), axes.end(), 0);
    if (node->input_size() > 3 && !node->input(3).empty()) {
      std::optional<std::vector<int64_t>> given = Numbers(node, 3);
      if (!given || given->size() != axes.size()) return;
      axes = *given;
    }
    if (node->input_size() > 4 && !node->input(4).empty()) {
      std::optional<std::vector<int64_t>> given = Numbers(node, 4);
      if (!given || given->size() != steps.size()) return;
      steps = *given;
    }
    Dims out = *in;
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t axis = NormalizeAxis(axes[i], in->size());
      if (axis < 0 || axis >= static_cast<int64_t>(in->size()) || steps[i] == 0) return;
      const int64_t size = (*in)[static_cast<size_t>(axis)].value;
      if (size < 0) return;
      auto clamp = [&](int64_t at) { return std::clamp<int64_t>(at < 0 ? at + size : at, 0, size); };
      const int64_t start = clamp((*starts)[i].value), end = clamp((*ends)[i].value);
      if (steps[i] != 1) {
        out[static_cast<size_t>(axis)] = Dim{-1, -1};
        continue;
      }
      const int64_t length = std::max<int64_t>(0, end - start);
      // The whole axis: as long as the axis; [0, end) of a longer one: as long as its end says.
      if (start == 0 && (*ends)[i].value >= size) {
        out[static_cast<size_t>(axis)] = (*in)[static_cast<size_t>(axis)];
      } else if (start == 0) {
        out[static_cast<size_t>(axis)] = Dim{length, (*ends)[i].var};
      } else {
        out[static_cast<size_t>(axis)] = Derived(length);
      }
    }
    SetShape(node, 0, out);
  }

  void VisitExpand(Node* node, const Dims* in) {
    const Dims* shape = ValueOf(node, 1);
    if (in == nullptr || shape == nullptr) return;
    SetShape(node, 0, Broadcast({in, shape}));
  }

  void VisitConstantOfShape(Node* node, const Dims* in) {
    if (const Dims* shape = ValueOf(node, 0)) SetShape(node, 0, *shape);
  }

  void VisitRange(Node* node, const Dims* in) {
    const Dims* start = ValueOf(node, 0);
    const Dims* limit = ValueOf(node, 1);
    const Dims* delta = ValueOf(node, 2);
    if (start == nullptr || limit == nullptr || delta == nullptr || start->size() != 1 || limit->size() != 1 ||
        delta->size() != 1 || (*delta)[0].value == 0) {
      return;
    }
    const int64_t step = (*delta)[0].value;
    const int64_t count =
        std::max<int64_t>(0, ((*limit)[0].value - (*start)[0].value + step - (step > 0 ? 1 : -1)) / step);
    SetShape(node, 0, {(*start)[0].value == 0 && step == 1 ? (*limit)[0] : Derived(count)});
  }

  void VisitTile(Node* node, const Dims* in) {
    const Dims* repeats = ValueOf(node, 1);
    if (in == nullptr || repeats == nullptr || repeats->size() != in->size()) return;
    Dims out;
    for (size_t i = 0; i < in->size(); ++i) {
      const Dim& dim = (*in)[i];
      const Dim& times = (*repeats)[i];
      out.push_back(dim.value == 1 ? times : times.value == 1 ? dim : Derived(dim.value * times.value));
    }
    SetShape(node, 0, out);
  }

  void VisitSplit(Node* node, const Dims* in) {
    if (in == nullptr) return;
    const int64_t axis = NormalizeAxis(node->GetAttributeInt("axis", 0), in->size());
    if (axis < 0 || axis >= static_cast<int64_t>(in->size())) return;
    const Dims* sizes = ValueOf(node, 1);
    for (int i = 0; i < node->output_size(); ++i) {
      Dims out = *in;
      if (sizes != nullptr && i < static_cast<int>(sizes->size())) {
        out[static_cast<size_t>(axis)] = (*sizes)[static_cast<size_t>(i)];
      } else if (const onnx::AttributeProto* split = node->FindAttribute("split");
                 split != nullptr && i < split->ints_size()) {
        out[static_cast<size_t>(axis)] = Dim{split->ints(i), -1};
      } else if ((*in)[static_cast<size_t>(axis)].value > 0) {
        out[static_cast<size_t>(axis)] = Derived((*in)[static_cast<size_t>(axis)].value / node->output_size());
      } else {
        return;
      }
      SetShape(node, i, out);
    }
  }

  void VisitReduce(Node* node, const Dims* in) {
    const absl::string_view op = node->op_type();
    if (in == nullptr) return;
    std::optional<std::vector<int64_t>> axes;
    if (op == "ArgMax" || op == "ArgMin") {
      axes = std::vector<int64_t>{node->GetAttributeInt("axis", 0)};
    } else {
      axes = Axes(node, 1);
      const bool given = node->FindAttribute("axes") != nullptr || (node->input_size() > 1 && !node->input(1).empty());
      if (given && !axes) return;  // axes computed at run time: the shape is unknown here
      if (!given && node->GetAttributeInt("noop_with_empty_axes", 0) != 0) return SetShape(node, 0, *in);
    }
    const bool keep = node->GetAttributeInt("keepdims", 1) != 0;
    Dims out;
    for (size_t i = 0; i < in->size(); ++i) {
      const bool reduced =
          !axes || axes->empty() || std::count_if(axes->begin(), axes->end(), [&](int64_t axis) {
                                      return NormalizeAxis(axis, in->size()) == static_cast<int64_t>(i);
                                    }) > 0;
      if (!reduced) {
        out.push_back((*in)[i]);
      } else if (keep) {
        out.push_back(Dim{1, -1});
      }
    }
    SetShape(node, 0, out);
  }

  LengthProvenance Collect() {
    std::map<int, int> freed_of_set;  // set root -> FreedDim index
    LengthProvenance provenance;
    for (size_t var = 0; var < origins_.size(); ++var) {
      if (origins_[var].kind != Origin::kInput) continue;
      auto [it, added] = freed_of_set.emplace(Find(static_cast<int>(var)), origins_[var].freed);
      if (!added &&
          dims_[static_cast<size_t>(it->second)].name != dims_[static_cast<size_t>(origins_[var].freed)].name) {
        provenance.conflict = absl::StrCat("the graph makes '", dims_[static_cast<size_t>(it->second)].name, "' and '",
                                           dims_[static_cast<size_t>(origins_[var].freed)].name, "' one dim");
      }
    }
    auto freed = [&](int var) {
      auto it = var < 0 ? freed_of_set.end() : freed_of_set.find(Find(var));
      return it == freed_of_set.end() ? -1 : it->second;
    };
    for (size_t var = 0; var < origins_.size(); ++var) {
      const Origin& origin = origins_[var];
      const int k = freed(static_cast<int>(var));
      if (k < 0) continue;
      if (origin.kind == Origin::kElement) provenance.elements[origin.read][origin.index] = k;
      if (origin.kind == Origin::kDim) provenance.tables[origin.read][origin.index] = k;
    }
    for (const auto& output : graph_.proto().output()) {
      auto it = shapes_.find(output.name());
      if (it == shapes_.end()) continue;
      for (size_t d = 0; d < it->second.size(); ++d) {
        const int k = freed(it->second[d].var);
        if (k >= 0) provenance.outputs[output.name()][static_cast<int>(d)] = k;
      }
    }
    return provenance;
  }

  const Graph& graph_;
  const std::vector<FreedDim>& dims_;
  std::vector<int> parent_;
  std::vector<Origin> origins_;
  // Node-based: the rules hold pointers into them while they add outputs.
  absl::node_hash_map<std::string, Dims> shapes_, values_;
  std::map<ConstantRead, Dims> read_shapes_, read_values_;
};

}  // namespace

LengthProvenance TraceLengths(const Graph& graph, const std::vector<FreedDim>& dims) {
  return Tracer(graph, dims).Run();
}

}  // namespace onnxopt
