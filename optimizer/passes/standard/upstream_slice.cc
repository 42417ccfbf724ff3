// upstream_slice: moves a Gather (constant indices) or single-axis Slice (constant bounds) above the
// node that produces its input, so that node computes only the part that is kept (ONNX Runtime's
// compute optimizer; RoBERTa/Electra classification heads taking `features[:, 0, :]`).
//
// Before:  x[B,S,H] -> Add(bias[H]) -> t[B,S,H] -> Gather(axis=1, index=0) -> y[B,H]
// After:   x[B,S,H] -> Gather(axis=1, index=0) -> x0[B,H] -> Add(bias[H]) -> y[B,H]
//
// The slice moves above:
// - unary element-wise ops (Relu, Erf, Tanh, Sigmoid, Cast, ...);
// - broadcasting element-wise ops (Add, Sub, Mul, Div, Pow, Where, ...): every input that has the
//   sliced axis with the output's size there is sliced, inputs without that axis are kept;
//   an input whose size there is 1 or unknown stops the move;
// - Softmax, LayerNormalization and ReduceMean/ReduceSum (keepdims=1, axes attribute) whose
//   reduction axes all come after the sliced axis;
// - the left operand of MatMul when the sliced axis is the row axis (-2) and the right operand is a
//   2-D matrix, or a batch axis the right operand does not have;
// - Transpose: the slice moves to axis perm[k] of its input (a scalar Gather drops that entry from
//   perm). Reshape is not crossed: exporters compute its target shape at run time.
// - ONNX Runtime's token-wise operators the transformer fusions write, on an axis before the last:
//   Gelu, QuickGelu, BiasGelu, FastGelu (bias over the last axis), SimplifiedLayerNormalization, and
//   (Simplified)SkipLayerNormalization (input and skip sliced as broadcasting inputs), so a
//   classification head on the first token makes the last layer's feed-forward block compute one.
// The producer's output must be read by the slice alone (or by identical slices, which become one);
// its other outputs (a LayerNorm's statistics, SkipLayerNorm's residual sum) must be read by nothing.
// A Gather with a scalar index removes the axis, so positive reduction axes after it shift down.
// Shapes come from shape inference; where a rank or size is unknown, the slice stays.
#include <deque>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

const std::set<std::string, std::less<>>& UnaryOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{
      "Relu", "Erf", "Tanh", "Sigmoid", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Cast", "Identity",
      "Softplus", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Gelu", "Not", "Sign", "Floor", "Ceil", "Round"};
  return *ops;
}

// com.microsoft operators that work token by token: element-wise, with a bias over the last axis.
const std::set<std::string, std::less<>>& TokenwiseContribOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{"Gelu", "QuickGelu", "BiasGelu", "FastGelu"};
  return *ops;
}

const std::set<std::string, std::less<>>& BroadcastOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{
      "Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "And", "Or", "Max", "Min", "PRelu"};
  return *ops;
}

// A Gather with constant indices or a Slice with constant bounds on one axis.
struct Slicer {
  Node* node = nullptr;
  int64_t axis = 0;          // normalized to the sliced value's rank
  bool removes_axis = false;  // Gather with a scalar index
};

std::optional<Slicer> AsSlicer(const Graph& graph, Node* node, int rank) {
  if (!node->domain().empty() || rank <= 0) return std::nullopt;
  Slicer slicer;
  slicer.node = node;
  if (node->op_type() == "Gather" && node->input_size() == 2) {
    const onnx::TensorProto* indices = ConstantTensor(graph, node->input(1));
    if (indices == nullptr || indices->dims_size() > 1) return std::nullopt;
    slicer.removes_axis = indices->dims_size() == 0;
    slicer.axis = node->GetAttributeInt("axis", 0);
  } else if (node->op_type() == "Slice" && node->input_size() >= 4) {
    for (int i = 1; i < node->input_size(); ++i) {
      if (!node->input(i).empty() && ConstantTensor(graph, node->input(i)) == nullptr) return std::nullopt;
    }
    auto axes = ConstantInts(graph, node->input(3));
    if (!axes || axes->size() != 1) return std::nullopt;
    slicer.axis = (*axes)[0];
  } else {
    return std::nullopt;
  }
  if (slicer.axis < 0) slicer.axis += rank;
  if (slicer.axis < 0 || slicer.axis >= rank) return std::nullopt;
  return slicer;
}

// Two slicers do the same thing (op, constant operands and attributes equal).
bool SameSlice(const Node& a, const Node& b) {
  if (a.op_type() != b.op_type() || a.input_size() != b.input_size()) return false;
  for (int i = 1; i < a.input_size(); ++i) {
    if (a.input(i) != b.input(i)) return false;
  }
  return a.GetAttributeInt("axis", 0) == b.GetAttributeInt("axis", 0);
}

class UpstreamSlicePass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "upstream_slice"; }
  absl::string_view description() const override {
    return "Move Gather/Slice above element-wise ops, Softmax/LayerNorm/Reduce, MatMul and ONNX Runtime's token-wise "
           "operators so less is computed";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    std::deque<Node*> worklist;
    for (Node* node : graph.Nodes()) {
      if (node->op_type() == "Gather" || node->op_type() == "Slice") worklist.push_back(node);
    }
    int budget = 10000;  // every move goes one node up a finite graph; this only bounds bad input
    while (!worklist.empty() && budget-- > 0) {
      Node* node = worklist.front();
      worklist.pop_front();
      if (node->removed()) continue;
      std::vector<Node*> moved = TryMove(graph, node, shapes, context);
      worklist.insert(worklist.end(), moved.begin(), moved.end());
    }
    return absl::OkStatus();
  }

 private:
  // Moves `node` above its input's producer if legal; returns the new slicers.
  static std::vector<Node*> TryMove(Graph& graph, Node* node, const ShapeInfo& shapes, PassContext& context) {
    const std::string value = node->input(0);
    Node* producer = graph.Producer(value);
    const auto out_rank = shapes.Rank(value);
    if (producer == nullptr || graph.IsGraphOutput(value) || producer->output(0) != value) return {};
    for (int i = 1; i < producer->output_size(); ++i) {  // statistics, residual sums: nobody may read them
      const std::string& extra = producer->output(i);
      if (!extra.empty() && (graph.HasConsumers(extra) || graph.IsGraphOutput(extra))) return {};
    }
    if (!out_rank) {
      context.Skip("upstream_slice: the sliced value's shape is unknown (a dynamic Reshape? fix_dynamic_dims helps)");
      return {};
    }
    std::optional<Slicer> slicer = AsSlicer(graph, node, *out_rank);
    if (!slicer) return {};
    // Every reader of the value must be this slice or an identical one.
    std::vector<Node*> twins;
    for (Node* consumer : graph.Readers(value)) {
      if (consumer == node || (!twins.empty() && twins.back() == consumer)) continue;
      if (consumer->input(0) != value || !SameSlice(*consumer, *node) || graph.IsGraphOutput(consumer->output(0))) {
        return {};
      }
      twins.push_back(consumer);
    }
    const absl::string_view op = producer->op_type();
    const int64_t axis = slicer->axis;
    const int rank = *out_rank;
    std::vector<int> sliced_inputs;            // which producer inputs get a copy of the slice
    std::vector<int64_t> input_axes;           // the axis in that input
    std::vector<std::pair<std::string, std::vector<int64_t>>> axes_updates;  // attribute -> new value

    auto same_dim = [&](const std::string& input, int64_t input_axis) {
      const onnx::TypeProto* a = shapes.TypeOf(input);
      const onnx::TypeProto* b = shapes.TypeOf(value);
      if (a == nullptr || b == nullptr || !a->tensor_type().has_shape() || !b->tensor_type().has_shape()) return false;
      const auto& da = a->tensor_type().shape().dim(static_cast<int>(input_axis));
      const auto& db = b->tensor_type().shape().dim(static_cast<int>(axis));
      if (da.has_dim_value() && db.has_dim_value()) return da.dim_value() == db.dim_value() && da.dim_value() != 1;
      return da.has_dim_param() && db.has_dim_param() && !da.dim_param().empty() && da.dim_param() == db.dim_param();
    };
    // Reduction axes (attribute) all after the sliced axis; returns the shifted axes if the slice
    // removes the axis.
    auto reduction_after = [&](const std::vector<int64_t>& axes, std::vector<int64_t>* shifted) {
      for (int64_t a : axes) {
        const int64_t normalized = a < 0 ? a + rank : a;
        if (normalized <= axis) return false;
        shifted->push_back(slicer->removes_axis && a >= 0 ? a - 1 : a);
      }
      return true;
    };

    // Inputs that broadcast against the output: sliced where they have the axis at the output's size.
    auto slice_broadcasting = [&](int first, int last) {
      for (int i = first; i <= last && i < producer->input_size(); ++i) {
        if (producer->input(i).empty()) continue;
        const auto input_rank = shapes.Rank(producer->input(i));
        if (!input_rank) {
          context.Skip("upstream_slice: an input's rank is unknown");
          return false;
        }
        const int64_t aligned = axis - (rank - *input_rank);
        if (aligned < 0) continue;  // the input has no such axis: it broadcasts either way
        if (!same_dim(producer->input(i), aligned)) {
          context.Skip("upstream_slice: an input's size on the sliced axis is 1 or unknown");
          return false;
        }
        sliced_inputs.push_back(i);
        input_axes.push_back(aligned);
      }
      return true;
    };
    // The remaining inputs (gamma, beta, biases) must hold the last axis alone.
    auto last_axis_only = [&](int first) {
      for (int i = first; i < producer->input_size(); ++i) {
        if (!producer->input(i).empty() && shapes.Rank(producer->input(i)).value_or(0) != 1) return false;
      }
      return axis < rank - 1;
    };

    if (producer->domain() == "com.microsoft") {
      if (TokenwiseContribOps().count(op) > 0 && last_axis_only(1)) {
        sliced_inputs = {0};
        input_axes = {axis};
      } else if ((op == "SkipLayerNormalization" || op == "SkipSimplifiedLayerNormalization") && last_axis_only(2)) {
        if (!slice_broadcasting(0, 1)) return {};
      } else {
        return {};
      }
    } else if (!producer->domain().empty()) {
      return {};
    } else if (UnaryOps().count(op) > 0 || (op == "Clip" && producer->input_size() >= 1)) {
      sliced_inputs = {0};
      input_axes = {axis};
    } else if (BroadcastOps().count(op) > 0) {
      if (!slice_broadcasting(0, producer->input_size() - 1)) return {};
    } else if (op == "Softmax" || op == "LayerNormalization" || op == "SimplifiedLayerNormalization") {
      std::vector<int64_t> shifted;
      const int64_t default_axis = op == "Softmax" && context.OpsetVersion("") < 13 ? 1 : -1;
      if (!reduction_after({producer->GetAttributeInt("axis", default_axis)}, &shifted)) return {};
      sliced_inputs = {0};
      input_axes = {axis};
      if (slicer->removes_axis) axes_updates.push_back({"axis", shifted});
    } else if ((op == "ReduceMean" || op == "ReduceSum") && producer->input_size() == 1) {
      const onnx::AttributeProto* axes = producer->FindAttribute("axes");
      if (axes == nullptr || producer->GetAttributeInt("keepdims", 1) != 1) return {};
      std::vector<int64_t> shifted;
      if (!reduction_after({axes->ints().begin(), axes->ints().end()}, &shifted)) return {};
      sliced_inputs = {0};
      input_axes = {axis};
      if (slicer->removes_axis) axes_updates.push_back({"axes", shifted});
    } else if (op == "Transpose") {
      const onnx::AttributeProto* perm = producer->FindAttribute("perm");
      if (perm == nullptr || perm->ints_size() != rank) return {};
      const int64_t source_axis = perm->ints(static_cast<int>(axis));
      sliced_inputs = {0};
      input_axes = {source_axis};
      if (slicer->removes_axis) {  // the input loses source_axis: drop it from perm and renumber
        std::vector<int64_t> new_perm;
        for (int64_t p : perm->ints()) {
          if (p != source_axis) new_perm.push_back(p > source_axis ? p - 1 : p);
        }
        axes_updates.push_back({"perm", new_perm});
      }
    } else if (op == "MatMul") {
      const auto a_rank = shapes.Rank(producer->input(0));
      const auto b_rank = shapes.Rank(producer->input(1));
      if (!a_rank || !b_rank || *a_rank < 2) return {};
      const int64_t aligned = axis - (rank - *a_rank);
      const bool row_axis = axis == rank - 2 && *b_rank == 2;
      const bool batch_axis_b_lacks = axis < rank - 2 && axis - (rank - *b_rank) < 0;
      if (aligned < 0 || (!row_axis && !batch_axis_b_lacks) || !same_dim(producer->input(0), aligned)) {
        context.Skip("upstream_slice: MatMul sliced on an axis its right operand shares");
        return {};
      }
      sliced_inputs = {0};
      input_axes = {aligned};
    } else {
      return {};
    }
    if (sliced_inputs.empty()) return {};

    // Rewrite: a copy of the slice on each chosen input, the producer writes the slice's output.
    std::vector<Node*> created;
    onnx::NodeProto rewired = producer->proto();
    for (size_t k = 0; k < sliced_inputs.size(); ++k) {
      const int i = sliced_inputs[k];
      onnx::NodeProto copy = node->proto();
      const std::string sliced = graph.UniqueName(producer->input(i) + "_sliced");
      copy.set_name(sliced);
      copy.set_input(0, producer->input(i));
      copy.set_output(0, sliced);
      if (copy.op_type() == "Gather") {
        bool found = false;
        for (auto& attribute : *copy.mutable_attribute()) {
          if (attribute.name() == "axis") {
            attribute.set_i(input_axes[k]);
            found = true;
          }
        }
        if (!found) {
          auto* attribute = copy.add_attribute();
          attribute->set_name("axis");
          attribute->set_type(onnx::AttributeProto::INT);
          attribute->set_i(input_axes[k]);
        }
      } else {
        const std::string axes = graph.UniqueName(sliced + "_axes");
        graph.AddInitializer(MakeInt64Tensor(axes, {input_axes[k]}));
        copy.set_input(3, axes);
      }
      rewired.set_input(i, sliced);
      created.push_back(graph.AddNode(std::move(copy), producer, /*after=*/false));
    }
    for (const auto& [name, values] : axes_updates) {
      onnx::AttributeProto* target = nullptr;
      for (auto& attribute : *rewired.mutable_attribute()) {
        if (attribute.name() == name) target = &attribute;
      }
      if (target == nullptr) {  // a default axis (Softmax < 13: 1) must now be spelled out
        target = rewired.add_attribute();
        target->set_name(name);
        target->set_type(name == "axis" ? onnx::AttributeProto::INT : onnx::AttributeProto::INTS);  // axes, perm
      }
      if (target->type() == onnx::AttributeProto::INT) {
        target->set_i(values[0]);
      } else {
        target->clear_ints();
        for (int64_t v : values) target->add_ints(v);
      }
    }
    const std::string output = node->output(0);
    rewired.set_output(0, output);
    for (Node* twin : twins) {
      const std::string twin_output = twin->output(0);
      graph.RemoveNode(twin);
      graph.ReplaceAllUsesWith(twin_output, output);
    }
    graph.RemoveNode(node);
    graph.RemoveNode(producer);
    graph.AddNode(std::move(rewired), producer, /*after=*/true);
    context.CountRewrite();
    return created;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeUpstreamSlicePass() { return std::make_unique<UpstreamSlicePass>(); }

}  // namespace onnxopt
