// make_dims_dynamic: frees static input dimensions that a traced export baked into the graph (the
// "fully hybridized export" problem: `arange(128)` instead of `arange_like(x)`), so the model runs at
// other lengths. Parameter `dims`: "input:axis=name,..." (e.g. "input_ids:1=sequence").
//
// Before:  input_ids: int64[1, 32]
//          Range(0, 32, 1); Reshape(x, [1, 32, 4, 16]); Expand(m, [1, 32]); ConstantOfShape([32]);
//          Slice(buffer, starts=[0], ends=[32]); position ids baked as the constant [[0, 1, ..., 31]]
// After:   input_ids: int64[1, sequence];  L = Gather(Shape(input_ids), 1)
//          Range(0, L, 1); Reshape(x, Concat([1], L, [4, 16])); Expand(m, Concat([1], L)); ...;
//          position ids = Unsqueeze(Range(0, L, 1), 0)
//
// Only integer constants in those shape-carrying slots are rewritten, and only elements equal to the
// freed length. The pass refuses (an error naming the node) where a rewrite could be wrong: a shape
// constant holding the length more than once next to other dims of that size (the model's own width
// equal to the length), or a constant whose shape carries the length (a baked mask) that it cannot
// derive. What it rewrites is then checked by parity at the original length; other lengths are the
// caller's to check (positions both runs share).
#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

struct FreedDim {
  std::string input;
  int64_t axis = 0;
  std::string name;
  int64_t length = 0;  // the static value it had
};

absl::StatusOr<std::vector<FreedDim>> ParseDims(const std::string& text) {
  std::vector<FreedDim> dims;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> named = absl::StrSplit(item, '=');
    std::vector<std::string> place = named.size() == 2 ? absl::StrSplit(named[0], ':') : std::vector<std::string>();
    FreedDim dim;
    if (place.size() != 2 || !absl::SimpleAtoi(place[1], &dim.axis) || dim.axis < 0 || named[1].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("make_dims_dynamic: '", item, "' is not input:axis=name"));
    }
    dim.input = place[0];
    dim.name = named[1];
    dims.push_back(dim);
  }
  if (dims.empty()) return absl::InvalidArgumentError("make_dims_dynamic: `dims` names no dimension");
  return dims;
}

class MakeDimsDynamicPass final : public Pass {
 public:
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }
  absl::string_view name() const override { return "make_dims_dynamic"; }
  absl::string_view description() const override {
    return "Free static input dims an export baked in: constants equal to the length in Range, Reshape, Expand, "
           "ConstantOfShape and Slice, and baked position ids, become shape arithmetic on the input";
  }
  std::vector<ParamSpec> params() const override {
    return {{"dims", ParamType::kString, "", "input:axis=name,... (e.g. input_ids:1=sequence)"}};
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    absl::StatusOr<std::vector<FreedDim>> dims = ParseDims(context.params().GetString("dims"));
    if (!dims.ok()) return dims.status();
    std::map<int64_t, std::string> length_values;  // static length -> the scalar computing it
    for (FreedDim& dim : *dims) {
      onnx::ValueInfoProto* input = nullptr;
      for (auto& candidate : *graph.mutable_proto()->mutable_input()) {
        if (candidate.name() == dim.input) input = &candidate;
      }
      if (input == nullptr) return absl::InvalidArgumentError(absl::StrCat("make_dims_dynamic: no input '", dim.input, "'"));
      auto* shape = input->mutable_type()->mutable_tensor_type()->mutable_shape();
      if (dim.axis >= shape->dim_size() || !shape->dim(static_cast<int>(dim.axis)).has_dim_value()) {
        return absl::InvalidArgumentError(absl::StrCat("make_dims_dynamic: ", dim.input, " has no static dim ", dim.axis));
      }
      dim.length = shape->dim(static_cast<int>(dim.axis)).dim_value();
      shape->mutable_dim(static_cast<int>(dim.axis))->set_dim_param(dim.name);
      if (length_values.count(dim.length) == 0) length_values[dim.length] = LengthOf(graph, dim);
      context.CountRewrite();
    }
    for (const auto& [length, scalar] : length_values) {
      absl::Status rewritten = RewriteConstants(graph, context, length, scalar);
      if (!rewritten.ok()) return rewritten;
    }
    // Declared shapes that still say the old length: graph outputs take the dim's name, value_info
    // entries go (shape inference makes them again).
    std::map<int64_t, std::string> names;
    for (const FreedDim& dim : *dims) names.emplace(dim.length, dim.name);
    for (auto& output : *graph.mutable_proto()->mutable_output()) {
      for (auto& dim : *output.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
        auto it = dim.has_dim_value() ? names.find(dim.dim_value()) : names.end();
        if (it != names.end()) dim.set_dim_param(it->second);
      }
    }
    auto* value_info = graph.mutable_proto()->mutable_value_info();
    for (int i = value_info->size() - 1; i >= 0; --i) {
      for (const auto& dim : value_info->Get(i).type().tensor_type().shape().dim()) {
        if (dim.has_dim_value() && names.count(dim.dim_value()) > 0) {
          value_info->DeleteSubrange(i, 1);
          break;
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  // Gather(Shape(input), axis): the freed length as an int64 scalar, placed first in the graph.
  static std::string LengthOf(Graph& graph, const FreedDim& dim) {
    const Node* first = graph.Nodes().empty() ? nullptr : graph.Nodes().front();
    const std::string shape = graph.UniqueName(absl::StrCat(dim.input, "_shape"));
    const std::string index = graph.UniqueName(absl::StrCat(dim.name, "_axis"));
    const std::string length = graph.UniqueName(dim.name);
    graph.AddInitializer(MakeIntScalar(index, onnx::TensorProto::INT64, dim.axis));
    graph.AddNode(MakeNode("Shape", "", {dim.input}, {shape}), first, /*after=*/false);
    graph.AddNode(MakeNode("Gather", "", {shape, index}, {length}), first, /*after=*/false);
    return length;
  }

  // 1-D int64 value [c0, .., L, .., cn]: the constant with each element equal to `length` taken from L.
  static std::string ShapeWithLength(Graph& graph, const Node* anchor, const std::vector<int64_t>& values, int64_t length,
                                     const std::string& scalar, bool axes_input) {
    const std::string length_1d = graph.UniqueName(absl::StrCat(scalar, "_1d"));
    graph.AddNode(UnsqueezeFirst(graph, scalar, length_1d, axes_input), anchor, /*after=*/false);
    std::vector<std::string> parts;
    std::vector<int64_t> run;
    auto flush = [&] {
      if (run.empty()) return;
      const std::string name = graph.UniqueName("dims");
      graph.AddInitializer(MakeInt64Tensor(name, run));
      parts.push_back(name);
      run.clear();
    };
    for (int64_t value : values) {
      if (value == length) {
        flush();
        parts.push_back(length_1d);
      } else {
        run.push_back(value);
      }
    }
    flush();
    const std::string joined = graph.UniqueName(absl::StrCat(scalar, "_shape"));
    onnx::NodeProto concat = MakeNode("Concat", "", parts, {joined});
    *concat.add_attribute() = MakeIntAttribute("axis", 0);
    graph.AddNode(std::move(concat), anchor, /*after=*/false);
    return joined;
  }

  // Unsqueeze(input, axes=[0]): axes an input from opset 13, an attribute before.
  static onnx::NodeProto UnsqueezeFirst(Graph& graph, const std::string& input, const std::string& output,
                                        bool axes_input) {
    if (!axes_input) {
      onnx::NodeProto node = MakeNode("Unsqueeze", "", {input}, {output});
      *node.add_attribute() = MakeIntsAttribute("axes", {0});
      return node;
    }
    const std::string axes = graph.UniqueName("axes0");
    graph.AddInitializer(MakeInt64Tensor(axes, {0}));
    return MakeNode("Unsqueeze", "", {input, axes}, {output});
  }

  static bool IsArange(const onnx::TensorProto& tensor, int64_t length) {
    std::optional<std::vector<int64_t>> values = TensorInts(tensor);
    if (!values || static_cast<int64_t>(values->size()) != length) return false;
    for (int64_t i = 0; i < length; ++i) {
      if ((*values)[static_cast<size_t>(i)] != i) return false;
    }
    for (int64_t dim : tensor.dims()) {
      if (dim != 1 && dim != length) return false;
    }
    return true;
  }

  static absl::Status RewriteConstants(Graph& graph, PassContext& context, int64_t length, const std::string& scalar) {
    const bool axes_input = context.OpsetVersion("") >= 13;
    // A length that is also one of the model's widths (a weight's dim) makes every shape constant
    // ambiguous: [1, 64, 64] could be (length, width) either way round.
    for (const auto& tensor : graph.proto().initializer()) {
      if (tensor.data_type() != onnx::TensorProto::FLOAT && tensor.data_type() != onnx::TensorProto::FLOAT16) continue;
      for (int64_t dim : tensor.dims()) {
        if (dim == length) {
          return absl::FailedPreconditionError(absl::StrCat(
              "make_dims_dynamic: the static length ", length, " is also a dimension of weight '", tensor.name(),
              "', so a shape constant holding ", length, " cannot be told apart; export at a length no model "
              "dimension has"));
        }
      }
    }
    for (Node* node : graph.Nodes()) {
      if (!node->domain().empty()) continue;
      const absl::string_view op = node->op_type();
      // (slot, kind): kind 0 = a shape vector, 1 = a scalar limit; either may be built from pieces.
      std::vector<std::pair<int, int>> slots;
      if (op == "Reshape" || op == "Expand" || op == "Tile") slots = {{1, 0}};
      if (op == "ConstantOfShape") slots = {{0, 0}};
      if (op == "Range") slots = {{1, 1}};
      if (op == "Slice") slots = {{2, 0}};
      for (auto [slot, kind] : slots) {
        if (slot >= node->input_size() || node->input(slot).empty()) continue;
        std::vector<std::pair<Node*, int>> leaves;
        if (op == "Tile" && (LengthLeaves(graph, node, slot, length, 0, &leaves), !leaves.empty())) {
          return absl::FailedPreconditionError(absl::StrCat(
              "make_dims_dynamic: ", node->name(), " tiles by the length; cannot tell a repeat count from a size"));
        }
        (void)kind;
        RewriteLeaves(graph, context, node, slot, length, scalar, axes_input);
      }
    }
    // Baked position ids ([0..L-1] as a constant read by a Gather) become Range(0, L) shaped alike.
    for (Node* node : graph.Nodes()) {
      if (node->op_type() != "Gather" || !node->domain().empty() || node->input_size() < 2) continue;
      const onnx::TensorProto* indices = ConstantTensor(graph, node->input(1));
      if (indices == nullptr || !IsArange(*indices, length) || length < 2) continue;
      const std::string zero = graph.UniqueName("zero"), one = graph.UniqueName("one");
      graph.AddInitializer(MakeIntScalar(zero, onnx::TensorProto::INT64, 0));
      graph.AddInitializer(MakeIntScalar(one, onnx::TensorProto::INT64, 1));
      const std::string positions = graph.UniqueName("positions");
      graph.AddNode(MakeNode("Range", "", {zero, scalar, one}, {positions}), node, /*after=*/false);
      std::string shaped = positions;
      if (indices->dims_size() == 2) {
        shaped = graph.UniqueName("positions_2d");
        graph.AddNode(UnsqueezeFirst(graph, positions, shaped, axes_input), node, /*after=*/false);
      }
      graph.SetInput(node, 1, shaped);
      context.CountRewrite();
    }
    // Anything else whose shape carries the length cannot be derived here.
    for (const auto& tensor : graph.proto().initializer()) {
      if (!graph.HasConsumers(tensor.name()) || tensor.dims_size() < 2) continue;
      int carried = 0;
      for (int64_t dim : tensor.dims()) carried += dim == length;
      if (carried >= 2) {
        return absl::FailedPreconditionError(absl::StrCat(
            "make_dims_dynamic: constant '", tensor.name(), "' is ", length, "x", length,
            " (a baked mask?): it cannot be derived from the input; re-export with dynamic axes"));
      }
    }
    return absl::OkStatus();
  }

  // Shapes built by the exporter from pieces: Concat of Unsqueezed scalar constants (torch without
  // constant folding), through Cast/Identity/Squeeze. Walks from `consumer`'s input `slot` back to the
  // constant leaves holding `length`, as (reader, input index) pairs.
  static void LengthLeaves(const Graph& graph, Node* consumer, int slot, int64_t length, int depth,
                           std::vector<std::pair<Node*, int>>* leaves) {
    const std::string& value = consumer->input(slot);
    if (const onnx::TensorProto* tensor = ConstantTensor(graph, value)) {
      std::optional<std::vector<int64_t>> values = TensorInts(*tensor);
      if (values && std::count(values->begin(), values->end(), length) > 0) leaves->push_back({consumer, slot});
      return;
    }
    Node* producer = graph.Producer(value);
    if (producer == nullptr || depth > 8 || !producer->domain().empty()) return;
    const absl::string_view op = producer->op_type();
    if (op == "Concat") {
      for (int i = 0; i < producer->input_size(); ++i) LengthLeaves(graph, producer, i, length, depth + 1, leaves);
    } else if (op == "Unsqueeze" || op == "Squeeze" || op == "Cast" || op == "Identity") {
      LengthLeaves(graph, producer, 0, length, depth + 1, leaves);
    }
  }

  // Replaces, at each leaf's own use, the elements equal to `length` (scalars and 1-D constants).
  static void RewriteLeaves(Graph& graph, PassContext& context, Node* consumer, int slot, int64_t length,
                            const std::string& scalar, bool axes_input) {
    std::vector<std::pair<Node*, int>> leaves;
    LengthLeaves(graph, consumer, slot, length, 0, &leaves);
    for (auto [reader, index] : leaves) {
      const onnx::TensorProto* tensor = ConstantTensor(graph, reader->input(index));
      if (tensor->dims_size() > 1) continue;
      std::string replacement = tensor->dims_size() == 0
                                    ? scalar
                                    : ShapeWithLength(graph, reader, *TensorInts(*tensor), length, scalar, axes_input);
      if (tensor->data_type() != onnx::TensorProto::INT64) {
        replacement = AddCast(graph, replacement, tensor->data_type(), reader);
      }
      graph.SetInput(reader, index, replacement);
      context.CountRewrite();
    }
  }
};

}  // namespace

std::unique_ptr<Pass> MakeMakeDimsDynamicPass() { return std::make_unique<MakeDimsDynamicPass>(); }

}  // namespace onnxopt
