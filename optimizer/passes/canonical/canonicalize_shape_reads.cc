// canonicalize_shape_reads: a dimension read from an intermediate value is read from the graph input
// that defines it instead, so reading a size no longer keeps the intermediate (and what computes it)
// alive. T5's attention reads the key length as Shape(k)[2], which stopped the attention fusion from
// removing k's projection; ONNX Runtime's own shape-source simplification does the same.
//
// Before:  Gather(Shape(v), i)          v's dim i is the symbolic dim "sequence"
// After:   Gather(Shape(input), j)      the graph input whose dim j is "sequence"
// Checked: Shape of the whole tensor (no start/end), Gather on axis 0 with one constant index, the
// dim a named symbol (static dims are constant folding's), and a graph input with that symbol that the
// value is computed from (two inputs may declare the same name and still differ at run time).
#include <map>
#include <unordered_set>
#include <vector>

#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// True if `value` is computed from the graph input `input` (walking producers back).
bool ComputedFrom(const Graph& graph, const std::string& value, const std::string& input) {
  std::unordered_set<std::string> seen;
  std::vector<std::string> pending = {value};
  while (!pending.empty()) {
    const std::string current = pending.back();
    pending.pop_back();
    if (current == input) return true;
    if (!seen.insert(current).second) continue;
    if (const Node* producer = graph.Producer(current)) {
      for (const std::string& operand : producer->proto().input()) pending.push_back(operand);
    }
  }
  return false;
}

class CanonicalizeShapeReadsPass final : public Pass {
 public:
  absl::string_view name() const override { return "canonicalize_shape_reads"; }
  absl::string_view description() const override {
    return "Read a named dimension from the graph input that defines it rather than from an intermediate value";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    // Named dim -> (graph input, position), first input first.
    std::map<std::string, std::pair<std::string, int>> sources;
    for (const auto& input : graph.proto().input()) {
      if (graph.Initializer(input.name()) != nullptr || !input.type().tensor_type().has_shape()) continue;
      const auto& dims = input.type().tensor_type().shape().dim();
      for (int i = 0; i < dims.size(); ++i) {
        if (dims[i].has_dim_param() && !dims[i].dim_param().empty()) {
          sources.emplace(dims[i].dim_param(), std::make_pair(input.name(), i));
        }
      }
    }
    std::map<std::string, std::string> input_shapes;  // graph input -> its Shape node's output
    for (Node* gather : graph.Nodes()) {
      if (gather->removed() || gather->op_type() != "Gather" || !gather->domain().empty() ||
          gather->input_size() != 2 || gather->GetAttributeInt("axis", 0) != 0) {
        continue;
      }
      Node* shape = ProducerWithOp(graph, gather->input(0), "Shape");
      auto index = ConstantInts(graph, gather->input(1));
      if (shape == nullptr || !index || index->size() != 1 || shape->FindAttribute("start") != nullptr ||
          shape->FindAttribute("end") != nullptr) {
        continue;
      }
      const std::string& read = shape->input(0);
      if (graph.IsGraphInput(read)) continue;
      const onnx::TensorShapeProto::Dimension* dim = shapes->Dim(read, static_cast<int>((*index)[0]));
      if (dim == nullptr || !dim->has_dim_param() || dim->dim_param().empty()) continue;
      auto source = sources.find(dim->dim_param());
      if (source == sources.end()) continue;
      const auto& [input, position] = source->second;
      // Named dims are one size only by declaration (ONNX Runtime does not check that two inputs
      // declared "sequence" agree): take the input only when the value is computed from it.
      if (!ComputedFrom(graph, read, input)) continue;
      auto known = input_shapes.find(input);
      if (known == input_shapes.end()) {
        onnx::NodeProto read_shape;
        read_shape.set_op_type("Shape");
        read_shape.set_name(graph.UniqueName(input + "_shape"));
        read_shape.add_input(input);
        read_shape.add_output(graph.UniqueName(input + "_shape"));
        known = input_shapes.emplace(input, read_shape.output(0)).first;
        graph.AddNode(std::move(read_shape), gather, /*after=*/false);
      }
      const std::string position_name = graph.UniqueName(gather->output(0) + "_dim");
      onnx::TensorProto position_tensor = MakeInt64Tensor(position_name, {position});
      if (ConstantTensor(graph, gather->input(1))->dims_size() == 0) position_tensor.clear_dims();  // keep its rank
      graph.AddInitializer(std::move(position_tensor));
      graph.SetInput(gather, 0, known->second);
      graph.SetInput(gather, 1, position_name);
      context.CountRewrite();  // the old Shape goes with the dead-node cleanup when nothing else reads it
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeShapeReadsPass() { return std::make_unique<CanonicalizeShapeReadsPass>(); }

}  // namespace onnxopt
