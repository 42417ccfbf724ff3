// make_dims_dynamic: frees static input dimensions that a traced export baked into the graph (the
// "fully hybridized export" problem: `arange(128)` instead of `arange_like(x)`), so the model runs at
// other lengths. Parameter `dims`: "input:axis=name,..." (e.g. "input_ids:1=sequence").
//
// Before:  input_ids: int64[1, 32]
//          Range(0, 32, 1); Reshape(x, [1, 32, 3, 32]) (the second 32 a head size); Expand(m, [1, 32]);
//          position ids baked as [[0, 1, ..., 31]]; a causal mask baked as a [1, 1, 32, 32] constant
// After:   input_ids: int64[1, sequence];  L = Gather(Shape(input_ids), 1)
//          Range(0, L, 1); Reshape(x, Concat([1], L, [3, 32])); Expand(m, Concat([1], L));
//          position ids = Unsqueeze(Range(0, L, 1), 0); the mask = Where(col > row, b, a) over Range(0, L)
//
// What is the length is decided by provenance (length_provenance.h): a constant is rewritten where the
// graph makes it the input's dim, never because its value is equal; the head size above stays. Baked
// tables whose shape carries the length are rebuilt from L where onnxopt knows how (an arange, a
// triangular mask); any other is refused, naming the constant. What it rewrites is then checked by parity
// at the original length and by the job's length check at others.
#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/interface/length_provenance.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

absl::StatusOr<std::vector<FreedDim>> ParseFreedDims(const std::string& text) {
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
    return "Free static input dims an export baked in: the constants the graph makes the input's dim (Reshape, Expand, "
           "Range, Slice... targets; baked position ids and causal masks) become shape arithmetic on the input";
  }
  std::vector<ParamSpec> params() const override {
    return {{"dims", ParamType::kString, "", "input:axis=name,... (e.g. input_ids:1=sequence)"}};
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    if (!graph.is_main()) return absl::OkStatus();
    absl::StatusOr<std::vector<FreedDim>> dims = ParseFreedDims(context.params().GetString("dims"));
    if (!dims.ok()) return dims.status();
    for (FreedDim& dim : *dims) {
      onnx::TensorShapeProto* shape = InputShape(graph, dim.input);
      if (shape == nullptr) return absl::InvalidArgumentError(absl::StrCat("make_dims_dynamic: no input '", dim.input, "'"));
      if (dim.axis >= shape->dim_size() || !shape->dim(static_cast<int>(dim.axis)).has_dim_value()) {
        return absl::InvalidArgumentError(absl::StrCat("make_dims_dynamic: ", dim.input, " has no static dim ", dim.axis));
      }
      dim.length = shape->dim(static_cast<int>(dim.axis)).dim_value();
      if (dim.length <= 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "make_dims_dynamic: ", dim.input, " is ", dim.length, " along axis ", dim.axis,
            ": a traced length of 0 or 1 cannot be told from the graph's broadcast dims; export at a length > 1"));
      }
    }
    // Traced before anything changes; the rewrites then follow what it found.
    const LengthProvenance provenance = TraceLengths(graph, *dims);
    if (!provenance.conflict.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("make_dims_dynamic: ", provenance.conflict,
                                                        "; free them at different traced lengths, or one of them"));
    }
    if (absl::Status rebuildable = CheckTables(graph, provenance, *dims); !rebuildable.ok()) return rebuildable;
    std::vector<std::string> lengths;
    for (const FreedDim& dim : *dims) {
      InputShape(graph, dim.input)->mutable_dim(static_cast<int>(dim.axis))->set_dim_param(dim.name);
      lengths.push_back(LengthOf(graph, dim));
      context.CountRewrite();
    }
    const bool axes_input = context.OpsetVersion("") >= 13;
    for (const auto& [read, elements] : provenance.elements) {
      RewriteElements(graph, read, elements, lengths, axes_input);
      context.CountRewrite();
    }
    for (const auto& [read, table] : provenance.tables) {
      RebuildTable(graph, read, table, lengths, axes_input);
      context.CountRewrite();
    }
    for (auto& output : *graph.mutable_proto()->mutable_output()) {
      auto traced = provenance.outputs.find(output.name());
      if (traced == provenance.outputs.end()) continue;
      auto* shape = output.mutable_type()->mutable_tensor_type()->mutable_shape();
      for (const auto& [axis, k] : traced->second) {
        if (axis < shape->dim_size()) shape->mutable_dim(axis)->set_dim_param((*dims)[static_cast<size_t>(k)].name);
      }
    }
    // value_info that still says a freed length goes (shape inference makes it again).
    auto* value_info = graph.mutable_proto()->mutable_value_info();
    for (int i = value_info->size() - 1; i >= 0; --i) {
      for (const auto& dim : value_info->Get(i).type().tensor_type().shape().dim()) {
        if (dim.has_dim_value() && std::any_of(dims->begin(), dims->end(), [&](const FreedDim& freed) {
              return freed.length == dim.dim_value();
            })) {
          value_info->DeleteSubrange(i, 1);
          break;
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  static onnx::TensorShapeProto* InputShape(Graph& graph, const std::string& name) {
    for (auto& input : *graph.mutable_proto()->mutable_input()) {
      if (input.name() == name) return input.mutable_type()->mutable_tensor_type()->mutable_shape();
    }
    return nullptr;
  }

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

  // Unsqueeze(input, axes): axes an input from opset 13, an attribute before.
  static onnx::NodeProto Unsqueeze(Graph& graph, const std::string& input, const std::string& output,
                                   const std::vector<int64_t>& axes, bool axes_input) {
    if (!axes_input) {
      onnx::NodeProto node = MakeNode("Unsqueeze", "", {input}, {output});
      *node.add_attribute() = MakeIntsAttribute("axes", axes);
      return node;
    }
    const std::string name = graph.UniqueName("axes");
    graph.AddInitializer(MakeInt64Tensor(name, axes));
    return MakeNode("Unsqueeze", "", {input, name}, {output});
  }

  // The constant read at `read` with its elements `elements` (index -> freed dim) taken from the lengths:
  // a scalar becomes the length itself; a vector a Concat of its constant runs and the lengths.
  static void RewriteElements(Graph& graph, const ConstantRead& read, const std::map<int, int>& elements,
                              const std::vector<std::string>& lengths, bool axes_input) {
    Node* reader = read.reader;
    const onnx::TensorProto* tensor = ConstantTensor(graph, reader->input(read.slot));
    const std::vector<int64_t> values = *TensorInts(*tensor);
    const int32_t type = tensor->data_type();
    std::string replacement;
    if (tensor->dims_size() == 0) {
      replacement = lengths[static_cast<size_t>(elements.begin()->second)];
    } else {
      std::vector<std::string> parts;
      std::vector<int64_t> run;
      auto flush = [&] {
        if (run.empty()) return;
        const std::string name = graph.UniqueName("dims");
        graph.AddInitializer(MakeInt64Tensor(name, run));
        parts.push_back(name);
        run.clear();
      };
      for (size_t i = 0; i < values.size(); ++i) {
        auto freed = elements.find(static_cast<int>(i));
        if (freed == elements.end()) {
          run.push_back(values[i]);
          continue;
        }
        flush();
        const std::string length_1d = graph.UniqueName(absl::StrCat(lengths[static_cast<size_t>(freed->second)], "_1d"));
        graph.AddNode(Unsqueeze(graph, lengths[static_cast<size_t>(freed->second)], length_1d, {0}, axes_input), reader,
                      /*after=*/false);
        parts.push_back(length_1d);
      }
      flush();
      replacement = graph.UniqueName("shape");
      onnx::NodeProto concat = MakeNode("Concat", "", parts, {replacement});
      *concat.add_attribute() = MakeIntAttribute("axis", 0);
      graph.AddNode(std::move(concat), reader, /*after=*/false);
    }
    if (type != onnx::TensorProto::INT64) replacement = AddCast(graph, replacement, type, reader);
    graph.SetInput(reader, read.slot, replacement);
  }

  // What a baked table is, when onnxopt can rebuild it: an arange along its one freed dim (position
  // ids), or a triangular [.., L, L] of two values (a causal mask: `above` where col > row + offset).
  struct Table {
    enum Kind { kArange, kTriangular } kind;
    int axis = 0;        // kArange: the dim the values run along
    int64_t offset = 0;  // kTriangular: col <= row + offset holds `below`
    std::string below, above;  // kTriangular: the two elements' bytes
  };

  static std::optional<Table> RecognizeTable(const onnx::TensorProto& tensor, const std::map<int, int>& freed) {
    const int rank = tensor.dims_size();
    for (int d = 0; d < rank; ++d) {
      if (freed.count(d) == 0 && tensor.dims(d) != 1) return std::nullopt;  // other dims broadcast only
    }
    if (freed.size() == 1) {
      std::optional<std::vector<int64_t>> values = TensorInts(tensor);
      if (!values) return std::nullopt;
      for (size_t i = 0; i < values->size(); ++i) {
        if ((*values)[i] != static_cast<int64_t>(i)) return std::nullopt;
      }
      return Table{Table::kArange, freed.begin()->first};
    }
    if (freed.size() != 2 || freed.begin()->first != rank - 2 || freed.rbegin()->first != rank - 1) return std::nullopt;
    const int64_t n = tensor.dims(rank - 1);
    std::string scratch;
    const absl::StatusOr<absl::string_view> raw = TensorBytes(tensor, &scratch);  // n x n elements (other dims 1)
    if (!raw.ok()) return std::nullopt;
    const size_t element = ElementSize(tensor.data_type());
    auto at = [&](int64_t row, int64_t col) { return raw->substr(static_cast<size_t>(row * n + col) * element, element); };
    Table table{Table::kTriangular};
    table.below = std::string(at(0, 0));
    int64_t run = 0;
    while (run < n && at(0, run) == table.below) ++run;
    if (run == n) return std::nullopt;  // one value throughout: no triangle
    table.offset = run - 1;
    table.above = std::string(at(0, run));
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t col = 0; col < n; ++col) {
        if (at(row, col) != (col <= row + table.offset ? table.below : table.above)) return std::nullopt;
      }
    }
    return table;
  }

  static absl::Status CheckTables(const Graph& graph, const LengthProvenance& provenance,
                                  const std::vector<FreedDim>& dims) {
    for (const auto& [read, freed] : provenance.tables) {
      const std::string& name = read.reader->input(read.slot);
      const onnx::TensorProto* tensor = ConstantTensor(graph, name);
      if (!RecognizeTable(*tensor, freed) ||
          std::any_of(freed.begin(), freed.end(), [&](const auto& entry) { return entry.second != freed.begin()->second; })) {
        return absl::FailedPreconditionError(absl::StrCat(
            "make_dims_dynamic: constant '", name, "' [", absl::StrJoin(tensor->dims(), ", "), "] (read by ",
            read.reader->op_type(), " '", read.reader->name(), "') is ", dims[static_cast<size_t>(freed.begin()->second)].length,
            " long where the graph makes it '", dims[static_cast<size_t>(freed.begin()->second)].name,
            "', and it is not a table onnxopt rebuilds from the length (an arange, a triangular mask): it cannot be "
            "derived from the input; re-export with dynamic axes"));
      }
    }
    return absl::OkStatus();
  }

  static void RebuildTable(Graph& graph, const ConstantRead& read, const std::map<int, int>& freed,
                           const std::vector<std::string>& lengths, bool axes_input) {
    Node* reader = read.reader;
    const onnx::TensorProto& tensor = *ConstantTensor(graph, reader->input(read.slot));
    const Table table = *RecognizeTable(tensor, freed);
    const std::string& length = lengths[static_cast<size_t>(freed.begin()->second)];
    const int rank = tensor.dims_size();
    const std::string zero = AddInt64Scalar(graph, "zero", 0), one = AddInt64Scalar(graph, "one", 1);
    const std::string steps = graph.UniqueName("positions");
    graph.AddNode(MakeNode("Range", "", {zero, length, one}, {steps}), reader, /*after=*/false);
    std::string built = steps;
    std::vector<int64_t> leading;  // the broadcast dims before the table's own
    if (table.kind == Table::kArange) {
      for (int d = 0; d < rank; ++d) {
        if (d != table.axis) leading.push_back(d);
      }
      if (tensor.data_type() != onnx::TensorProto::INT64) built = AddCast(graph, built, tensor.data_type(), reader);
    } else {
      // rows [L, 1] (+ offset) against cols [L]: above = col > row + offset.
      std::string rows = graph.UniqueName("rows");
      graph.AddNode(Unsqueeze(graph, steps, rows, {1}, axes_input), reader, /*after=*/false);
      if (table.offset != 0) {
        const std::string shifted = graph.UniqueName("rows_shifted");
        graph.AddNode(MakeNode("Add", "", {rows, AddInt64Scalar(graph, "offset", table.offset)}, {shifted}), reader,
                      /*after=*/false);
        rows = shifted;
      }
      const std::string above = graph.UniqueName("above_diagonal");
      graph.AddNode(MakeNode("Greater", "", {steps, rows}, {above}), reader, /*after=*/false);
      built = graph.UniqueName("triangle");
      if (tensor.data_type() == onnx::TensorProto::BOOL) {  // ONNX Runtime's Where takes no bool values
        if (table.above == std::string(1, '\1')) {
          built = above;
        } else {
          graph.AddNode(MakeNode("Not", "", {above}, {built}), reader, /*after=*/false);
        }
      } else {
        const std::string above_value = graph.UniqueName("above"), below_value = graph.UniqueName("below");
        graph.AddInitializer(MakeRawTensor(above_value, tensor.data_type(), {}, table.above));
        graph.AddInitializer(MakeRawTensor(below_value, tensor.data_type(), {}, table.below));
        graph.AddNode(MakeNode("Where", "", {above, above_value, below_value}, {built}), reader, /*after=*/false);
      }
      for (int d = 0; d < rank - 2; ++d) leading.push_back(d);
    }
    if (!leading.empty()) {
      const std::string shaped = graph.UniqueName(absl::StrCat(built, "_shaped"));
      graph.AddNode(Unsqueeze(graph, built, shaped, leading, axes_input), reader, /*after=*/false);
      built = shaped;
    }
    graph.SetInput(reader, read.slot, built);
  }
};

}  // namespace

std::unique_ptr<Pass> MakeMakeDimsDynamicPass() { return std::make_unique<MakeDimsDynamicPass>(); }

}  // namespace onnxopt
