// canonicalize_flattened_rows: TF1 BERT as tf2onnx writes it (Google's modeling.py) runs its encoder on
// 2-D activations: `reshape_to_matrix` flattens the embeddings [B, S, H] to [B*S, H] once, every Dense is
// MatMul + Add on the rows, each layer's context [B, S, N, D] is merged to [B*S, N*D], and LayerNorm
// reduces the rows' last axis. The same computation on [B, S, W] is the form the attention, LayerNorm,
// SkipLayerNormalization and Gelu fusions read (the context merged back to [B, S, H]).
//
// Before:  f = Reshape(x[B,S,H], [-1, H]); y = LayerNorm(Add(MatMul(f, W) + b, f));
//          c = Reshape(Transpose(ctx[B,N,S,D]), [B*S, N*D]); heads = Reshape(y, [B, S, N, D]) ...
// After:   the same nodes on x itself and on Reshape(Transpose(ctx), [0, 0, N*D]); reductions over axis 1
//          read axis -1; a Reshape out of the rows reads the 3-D value (the same elements in the same order).
// Checked: an entry flattens a tensor of rank >= 3 to rank 2 whose last dim (static) is the product of the
// tensor's dims after the first two (so the first is B*S); between entries and exits only row-wise nodes:
// MatMul by a 2-D weight, elementwise nodes whose other operands are rows too or broadcast the same onto
// [B*S, W] and [B, S, W] (rank <= 1, or [1, W]), reductions, LayerNormalization and Softmax over the last
// axis (keepdims), unary nodes; an exit is a Reshape whose target has no constant 0 (0 copies a dim). A
// group of rows connected through such nodes is rewritten only if no value of it is read otherwise or is a
// graph output, so nothing is computed twice.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

const std::set<std::string, std::less<>>& ElementwiseOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{
      "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
      "Erf", "Tanh", "Relu", "Sigmoid", "Sqrt", "Reciprocal", "Neg", "Exp", "Log", "Abs", "Cast", "Identity",
      "Softplus", "Dropout"};
  return *ops;
}

const std::set<std::string, std::less<>>& ReduceOps() {
  static const auto* ops = new std::set<std::string, std::less<>>{"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                                                                   "ReduceL2", "ReduceSumSquare"};
  return *ops;
}

// The product of dims 2.. of `value` when all are numbers.
std::optional<int64_t> TrailingWidth(const ShapeInfo& shapes, const std::string& value) {
  const std::optional<int> rank = shapes.Rank(value);
  if (!rank || *rank < 3) return std::nullopt;
  int64_t width = 1;
  for (int d = 2; d < *rank; ++d) {
    const std::optional<int64_t> dim = shapes.DimValue(value, d);
    if (!dim) return std::nullopt;
    width *= *dim;
  }
  return width;
}

// A Reshape of [B, S, ...] to the rows [B*S, W].
bool FlattensRows(const ShapeInfo& shapes, const Node& node) {
  if (node.op_type() != "Reshape" || !node.domain().empty() || node.input_size() != 2 ||
      node.GetAttributeInt("allowzero", 0) != 0 || shapes.Rank(node.output(0)) != 2) {
    return false;
  }
  const std::optional<int64_t> width = TrailingWidth(shapes, node.input(0));
  return width && shapes.DimValue(node.output(0), 1) == width;
}

// True if `value` broadcasts the same onto [B*S, W] and [B, S, W]: a scalar, a vector, or [1, W].
bool BroadcastsOntoRows(const ShapeInfo& shapes, const std::string& value) {
  const std::optional<int> rank = shapes.Rank(value);
  if (!rank) return false;
  return *rank <= 1 || (*rank == 2 && shapes.DimValue(value, 0) == 1);
}

// kNone: a reader that needs the rows as they are (its group stays as it is).
enum class Role { kNone, kEntry, kRowWise, kExit };

class CanonicalizeFlattenedRowsPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_flattened_rows"; }
  absl::string_view description() const override {
    return "Compute a transformer flattened to rows [B*S, W] (tf2onnx's TF1 BERT) on [B, S, W]";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    const int64_t opset = context.OpsetVersion("");
    // Analysis: the row values, grouped (union-find over their groups) and poisoned where a reader or the
    // graph's outputs need the rows as they are.
    absl::flat_hash_map<std::string, int> group_of;  // a row value -> its group
    std::vector<int> parent;
    std::vector<bool> poisoned;
    auto find = [&](int g) {
      while (parent[static_cast<size_t>(g)] != g) {
        int& up = parent[static_cast<size_t>(g)];
        up = parent[static_cast<size_t>(up)];  // halve the path
        g = up;
      }
      return g;
    };
    auto join = [&](int a, int b) {
      a = find(a), b = find(b);
      if (a == b) return a;
      parent[static_cast<size_t>(b)] = a;
      poisoned[static_cast<size_t>(a)] = poisoned[static_cast<size_t>(a)] || poisoned[static_cast<size_t>(b)];
      return a;
    };
    auto group = [&](const std::string& value) -> std::optional<int> {
      auto it = group_of.find(value);
      if (it == group_of.end()) return std::nullopt;
      return find(it->second);
    };
    const std::vector<Node*> nodes = graph.Nodes();
    absl::flat_hash_map<const Node*, Role> roles;
    for (Node* node : nodes) {
      if (node->removed()) continue;
      if (FlattensRows(shapes, *node) && !group(node->input(0))) {
        parent.push_back(static_cast<int>(parent.size()));
        poisoned.push_back(false);
        group_of[node->output(0)] = parent.back();
        roles[node] = Role::kEntry;
        continue;
      }
      std::optional<int> joined;
      for (const std::string& input : node->proto().input()) {
        if (std::optional<int> g = input.empty() ? std::nullopt : group(input)) joined = joined ? join(*joined, *g) : *g;
      }
      if (!joined) continue;
      const Role role = RoleOf(graph, shapes, *node, [&](const std::string& v) { return group(v).has_value(); }, opset);
      roles[node] = role;
      if (role == Role::kNone) {
        poisoned[static_cast<size_t>(*joined)] = true;
      } else if (role == Role::kRowWise) {
        group_of[node->output(0)] = *joined;
      }
    }
    for (const auto& [value, g] : group_of) {
      if (graph.IsGraphOutput(value)) poisoned[static_cast<size_t>(find(g))] = true;
    }
    // Rewrite: every node of a group that holds, in order.
    absl::flat_hash_map<std::string, std::string> rows3d;  // a row value -> its [B, S, W] twin
    absl::flat_hash_map<std::string, std::string> leading;  // a row value -> a tensor with its [B, S]
    std::vector<Node*> touched;
    std::set<int> rewritten;  // the groups
    for (Node* node : nodes) {
      auto role = roles.find(node);
      if (role == roles.end() || role->second == Role::kNone || node->removed()) continue;
      const std::string& out = node->output(0);
      // An entry's group is its output's; any other node's that of the rows it reads.
      std::optional<int> g = role->second == Role::kEntry ? group(out) : std::nullopt;
      for (int i = 0; !g && i < node->input_size(); ++i) {
        if (!node->input(i).empty()) g = group(node->input(i));
      }
      if (!g || poisoned[static_cast<size_t>(*g)]) continue;
      rewritten.insert(*g);
      if (role->second == Role::kEntry) {  // x itself, or x merged to [B, S, W]
        const std::string& x = node->input(0);
        leading[out] = x;
        if (shapes.Rank(x) == 3) {
          rows3d[out] = x;
        } else {
          const int64_t width = *shapes.DimValue(out, 1);
          const onnx::TensorProto* target =
              graph.AddInitializer(MakeInt64Tensor(graph.UniqueName(out + "_rows_shape"), {0, 0, width}));
          onnx::NodeProto reshape = node->proto();
          reshape.set_name(node->name().empty() ? "" : node->name() + "_rows");
          reshape.set_input(1, target->name());
          reshape.set_output(0, graph.UniqueName(out + "_rows"));
          rows3d[out] = reshape.output(0);
          touched.push_back(graph.AddNode(std::move(reshape), node, /*after=*/true));
        }
        touched.push_back(node);
        continue;
      }
      if (role->second == Role::kExit) {
        const std::string& rows = node->input(0);
        // Back to [B, S, W] itself (keras2onnx's Dense unflattening its MatMul): the twin is that value.
        const std::string& x = leading.at(rows);
        if (!graph.IsGraphOutput(out) && shapes.Rank(out) == 3 && shapes.SameDim(out, 0, x, 0) &&
            shapes.SameDim(out, 1, x, 1) && shapes.SameDim(out, 2, rows, 1)) {
          graph.ReplaceAllUsesWith(out, rows3d.at(rows));
          touched.push_back(node);
        } else {
          graph.SetInput(node, 0, rows3d.at(rows));
        }
        continue;
      }
      onnx::NodeProto twin = node->proto();
      twin.set_name(node->name().empty() ? "" : node->name() + "_rows");
      for (int i = twin.input_size() - 1; i >= 0; --i) {
        auto lifted = rows3d.find(twin.input(i));
        if (lifted == rows3d.end()) continue;
        leading[out] = leading.at(twin.input(i));
        twin.set_input(i, lifted->second);
      }
      ReadTheLastAxis(graph, *node, &twin);
      twin.set_output(0, graph.UniqueName(out + "_rows"));
      for (int i = 1; i < twin.output_size(); ++i) twin.set_output(i, "");
      rows3d[out] = twin.output(0);
      touched.push_back(graph.AddNode(std::move(twin), node, /*after=*/true));
      touched.push_back(node);
    }
    context.CountRewrite(static_cast<int64_t>(rewritten.size()));  // a group of rows each
    RemoveUnreadNodes(graph, std::move(touched));
    return absl::OkStatus();
  }

 private:
  // What `node`, which reads a row value, is to the rows.
  template <typename IsRows>
  static Role RoleOf(const Graph& graph, const ShapeInfo& shapes, const Node& node, IsRows is_rows, int64_t opset) {
    if (!node.domain().empty() || node.output_size() < 1) return Role::kNone;
    for (int i = 1; i < node.output_size(); ++i) {
      if (!node.output(i).empty() && (graph.HasConsumers(node.output(i)) || graph.IsGraphOutput(node.output(i)))) {
        return Role::kNone;  // Dropout's mask, LayerNormalization's statistics
      }
    }
    const absl::string_view op = node.op_type();
    if (op == "Reshape") {
      if (!is_rows(node.input(0)) || is_rows(node.input(1)) || node.GetAttributeInt("allowzero", 0) != 0) {
        return Role::kNone;
      }
      // A constant 0 copies a dim, which differs between the rows and [B, S, W]; computed elements are
      // sizes read at run time.
      if (const auto target = ConstantInts(graph, node.input(1))) {
        for (int64_t d : *target) {
          if (d == 0) return Role::kNone;
        }
      } else if (Node* concat = ProducerWithOp(graph, node.input(1), "Concat")) {
        for (const std::string& part : concat->proto().input()) {
          const auto constant = ConstantInts(graph, part);
          if (constant && std::find(constant->begin(), constant->end(), 0) != constant->end()) return Role::kNone;
        }
      } else {
        return Role::kNone;
      }
      return Role::kExit;
    }
    if (op == "MatMul") {
      return is_rows(node.input(0)) && !is_rows(node.input(1)) && shapes.Rank(node.input(1)) == 2 ? Role::kRowWise
                                                                                                    : Role::kNone;
    }
    if (ElementwiseOps().count(op) > 0) {
      if (op == "Dropout" && node.input_size() > 1) return Role::kNone;
      for (const std::string& input : node.proto().input()) {
        if (!is_rows(input) && !BroadcastsOntoRows(shapes, input)) return Role::kNone;
      }
      return Role::kRowWise;
    }
    if (!is_rows(node.input(0))) return Role::kNone;
    for (int i = 1; i < node.input_size(); ++i) {
      if (is_rows(node.input(i))) return Role::kNone;
    }
    if (ReduceOps().count(op) > 0) {
      const auto axes = ConstantAxes(graph, node);
      return node.GetAttributeInt("keepdims", 1) == 1 && axes && axes->size() == 1 && ((*axes)[0] == 1 || (*axes)[0] == -1)
                 ? Role::kRowWise
                 : Role::kNone;
    }
    if (op == "LayerNormalization" || op == "Softmax" || op == "LogSoftmax") {
      const int64_t axis = node.GetAttributeInt("axis", op == "LayerNormalization" || opset >= 13 ? -1 : 1);
      if (axis != 1 && axis != -1) return Role::kNone;
      for (int i = 1; i < node.input_size(); ++i) {
        if (!BroadcastsOntoRows(shapes, node.input(i))) return Role::kNone;
      }
      return Role::kRowWise;
    }
    return Role::kNone;
  }

  // The twin of a node that reads axis 1 of the rows reads the last axis of [B, S, W].
  static void ReadTheLastAxis(Graph& graph, const Node& node, onnx::NodeProto* twin) {
    const absl::string_view op = node.op_type();
    if (op == "LayerNormalization" || op == "Softmax" || op == "LogSoftmax") {
      for (auto& attribute : *twin->mutable_attribute()) {
        if (attribute.name() == "axis") attribute.set_i(-1);
      }
      if (op != "LayerNormalization" && node.FindAttribute("axis") == nullptr) *twin->add_attribute() = MakeIntAttribute("axis", -1);
      return;
    }
    if (ReduceOps().count(op) == 0) return;
    for (auto& attribute : *twin->mutable_attribute()) {
      if (attribute.name() == "axes") {
        attribute.clear_ints();
        attribute.add_ints(-1);
      }
    }
    if (node.FindAttribute("axes") == nullptr && node.input_size() >= 2 && !node.input(1).empty()) {
      const onnx::TensorProto* last = graph.AddInitializer(MakeInt64Tensor(graph.UniqueName(node.output(0) + "_last_axis"), {-1}));
      twin->set_input(1, last->name());
    }
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeFlattenedRowsPass() { return std::make_unique<CanonicalizeFlattenedRowsPass>(); }

}  // namespace onnxopt
