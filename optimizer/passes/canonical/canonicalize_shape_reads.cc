// canonicalize_shape_reads: a dimension read from an intermediate value is read from the graph input
// that defines it instead, so reading a size no longer keeps the intermediate (and what computes it)
// alive. T5's attention reads the key length as Shape(k)[2], which stopped the attention fusion from
// removing k's projection; ONNX Runtime's own shape-source simplification does the same.
//
// Before:  Gather(Shape(v), i)          v's dim i is the symbolic dim "sequence"
// After:   Gather(Shape(input), j)      the graph input whose dim j is "sequence"
// and the same for Slice(Shape(v), [i], [i + 1]) (torch's `x.size(-2)` in some exports), which
// becomes Slice(Shape(input), [j], [j + 1]). GPT-2's causal mask is sliced to the key length read
// so; read from the key it made the mask depend on every layer below, too deep for the attention
// fusion's mask probe from the 12th layer on.
// Checked: Shape of the whole tensor (no start/end), Gather on axis 0 with one constant index (or a
// one-element Slice with constant bounds, axis 0, step 1), the
// dim a named symbol (static dims are constant folding's), and a graph input with that symbol that the
// value is computed from (two inputs may declare the same name and still differ at run time).
#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// Every value computed from `input`, walking readers forward once (a walk back from each read would
// cost the whole network per read: quadratic on deep models). The names are views of the graph
// input's and the nodes' own: the pass adds nodes and rewires inputs, but renames and frees nothing.
// (Copies of 45k names into a node-based set were 40% of the pass on a 100k-node decoder.)
absl::flat_hash_set<absl::string_view> ComputedFrom(const Graph& graph, const std::string& input) {
  absl::flat_hash_set<absl::string_view> reached = {input};
  absl::flat_hash_set<const Node*> visited;
  std::vector<const std::string*> pending = {&input};
  while (!pending.empty()) {
    const std::string& current = *pending.back();
    pending.pop_back();
    for (const Node* reader : graph.Readers(current)) {
      if (!visited.insert(reader).second) continue;
      for (const std::string& output : reader->proto().output()) {
        if (!output.empty() && reached.insert(output).second) pending.push_back(&output);
      }
    }
  }
  return reached;
}

class CanonicalizeShapeReadsPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_shape_reads"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Read a named dimension from the graph input that defines it rather than from an intermediate value";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
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
    // Each equal position constant is made once, named after its first reader, and shared (every
    // layer reads the same positions): 9k copies of a 100k-node decoder were made only for
    // eliminate_duplicate_initializers to merge them.
    absl::flat_hash_map<std::pair<bool, std::vector<int64_t>>, std::string> constants;  // (scalar, values) -> name
    auto int64_constant = [&](const std::string& hint, std::vector<int64_t> values, bool scalar) -> std::string {
      auto [made, first] = constants.try_emplace({scalar, values});
      if (first) {
        made->second = graph.UniqueName(hint);
        onnx::TensorProto tensor = MakeInt64Tensor(made->second, values);
        if (scalar) tensor.clear_dims();
        graph.AddInitializer(std::move(tensor));
      }
      return made->second;
    };
    std::map<std::string, std::string> input_shapes;  // graph input -> its Shape node's output
    std::map<std::string, absl::flat_hash_set<absl::string_view>> computed_from;  // graph input -> its descendants
    for (Node* node : graph.Nodes()) {
      if (node->removed() || !node->domain().empty()) continue;
      const bool gather = node->op_type() == "Gather";
      if (!gather && node->op_type() != "Slice") continue;
      Node* shape = ProducerWithOp(graph, node->input(0), "Shape");
      if (shape == nullptr || shape->FindAttribute("start") != nullptr || shape->FindAttribute("end") != nullptr) continue;
      const std::optional<std::pair<std::string, int64_t>> dim_read = ShapeDimRead(graph, shapes, *node);
      if (!dim_read || graph.IsGraphInput(dim_read->first)) continue;
      const std::string& read = dim_read->first;
      const onnx::TensorShapeProto::Dimension* dim = shapes.Dim(read, static_cast<int>(dim_read->second));
      if (dim == nullptr || !dim->has_dim_param() || dim->dim_param().empty()) continue;
      auto source = sources.find(dim->dim_param());
      if (source == sources.end()) continue;
      const auto& [input, position] = source->second;
      // Named dims are one size only by declaration (ONNX Runtime does not check that two inputs
      // declared "sequence" agree): take the input only when the value is computed from it.
      auto descendants = computed_from.find(input);
      if (descendants == computed_from.end()) descendants = computed_from.emplace(input, ComputedFrom(graph, input)).first;
      if (descendants->second.count(read) == 0) continue;
      auto known = input_shapes.find(input);
      if (known == input_shapes.end()) {
        const std::string name = graph.UniqueName(input + "_shape");
        onnx::NodeProto read_shape = MakeNode("Shape", name, {input}, {graph.UniqueName(input + "_shape")});
        known = input_shapes.emplace(input, read_shape.output(0)).first;
        graph.AddNode(std::move(read_shape), node, /*after=*/false);
      }
      if (gather) {
        const bool scalar = ConstantTensor(graph, node->input(1))->dims_size() == 0;  // keep its rank
        graph.SetInput(node, 1, int64_constant(node->output(0) + "_dim", {position}, scalar));
      } else {
        graph.SetInput(node, 1, int64_constant(node->output(0) + "_start", {position}, false));
        graph.SetInput(node, 2, int64_constant(node->output(0) + "_end", {position + 1}, false));
        if (node->input_size() > 3 && !node->input(3).empty()) {
          graph.SetInput(node, 3, int64_constant(node->output(0) + "_axes", {0}, false));
        }
      }
      graph.SetInput(node, 0, known->second);
      context.CountRewrite();  // the old Shape goes with the dead-node cleanup when nothing else reads it
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeShapeReadsPass() { return std::make_unique<CanonicalizeShapeReadsPass>(); }

}  // namespace onnxopt
