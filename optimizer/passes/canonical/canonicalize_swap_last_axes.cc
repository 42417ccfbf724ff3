// canonicalize_swap_last_axes: torch's dynamo exporter writes `k.transpose(-2, -1)` on a 4-D tensor as
// a Reshape to 3-D, a 3-D Transpose and a Reshape back, with both shapes read from the tensor at run
// time. That is one Transpose of the last two axes, the form the attention fusion matches.
//
// Before:  s = Shape(x) (x of rank r)
//          y = Reshape(Transpose(Reshape(x, Concat([-1], s[-2:-1], s[-1:])), perm=[0,2,1]),
//                      Concat(s[:-2], s[-1:], s[-2:-1]))
// After:   y = Transpose(x, perm=[0, .., r-3, r-1, r-2])
// Checked: every shape piece is a Slice of Shape(x) itself (any Shape node reading x) with exactly
// those bounds, or (after constant folding or shape tracking) both shapes are, element by element,
// those dims of x (the same numbers or named dims); the first Reshape's lead is the constant -1, x's
// rank is known, and the intermediate values have no other reader. Equal on every input the original accepts (an empty x makes the -1
// Reshape fail there).
#include <limits>

#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// Bounds of a Slice of Shape(x): [start, end) with "to the end" and "from the start" kept as such.
struct ShapeSlice {
  std::string of;
  int64_t start = 0;
  int64_t end = 0;
};

constexpr int64_t kToEnd = std::numeric_limits<int64_t>::max();
constexpr int64_t kFromStart = std::numeric_limits<int64_t>::min();

std::optional<ShapeSlice> MatchShapeSlice(const Graph& graph, const std::string& value) {
  Node* slice = ProducerWithOp(graph, value, "Slice");
  if (slice == nullptr || slice->input_size() < 3) return std::nullopt;
  Node* shape = ProducerWithOp(graph, slice->input(0), "Shape");
  if (shape == nullptr || shape->GetAttributeInt("start", 0) != 0 || shape->FindAttribute("end") != nullptr) {
    return std::nullopt;
  }
  const std::optional<SliceSpec> spec = ParseSlice(graph, *slice);
  if (!spec || !spec->starts || !spec->ends || !spec->OneAxis(0, 1)) return std::nullopt;
  ShapeSlice result{shape->input(0), (*spec->starts)[0], (*spec->ends)[0]};
  if (result.end >= kToEnd / 2) result.end = kToEnd;
  if (result.start <= kFromStart / 2) result.start = kFromStart;
  return result;
}

// True if the shape tensor `value` is, element by element, `dims`: dims of x (their numbers where x's
// shape is known, or the same named dims), where kMinusOne stands for the literal -1. This is what is
// left of the Shape(x) slices once constant folding or shape tracking made them values.
constexpr int kMinusOne = -1;
bool ShapeValueIs(const Graph& graph, const ShapeInfo& shapes, const std::string& value, const std::string& x,
                  const std::vector<int>& dims) {
  if (dims.empty() || ShapeValueSize(graph, shapes, value) != dims.size()) return false;
  for (size_t i = 0; i < dims.size(); ++i) {
    const bool same = dims[i] == kMinusOne ? ShapeValueElement(graph, shapes, value, i) == -1
                                           : ElementIsDim(graph, shapes, value, i, x, dims[i]);
    if (!same) return false;
  }
  return true;
}

// The pieces of a Concat (axis 0) of shape slices; false unless every input but a leading -1 is one.
bool MatchPieces(const Graph& graph, const std::string& value, bool lead_minus_one, const std::string& x,
                 const std::vector<std::pair<int64_t, int64_t>>& bounds) {
  Node* concat = ProducerWithOp(graph, value, "Concat");
  const size_t offset = lead_minus_one ? 1 : 0;
  if (concat == nullptr || concat->GetAttributeInt("axis", 0) != 0 ||
      concat->input_size() != static_cast<int>(bounds.size() + offset)) {
    return false;
  }
  if (lead_minus_one) {
    auto lead = ConstantInts(graph, concat->input(0));
    if (!lead || *lead != std::vector<int64_t>{-1}) return false;
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    auto piece = MatchShapeSlice(graph, concat->input(static_cast<int>(i + offset)));
    if (!piece || piece->of != x || piece->start != bounds[i].first || piece->end != bounds[i].second) return false;
  }
  return true;
}

// The same two shapes as values: [-1, x[r-2], x[r-1]] and [x[0], .., x[r-3], x[r-1], x[r-2]].
bool SwapsAsValues(const Graph& graph, const ShapeInfo& shapes, const std::string& flat_shape,
                   const std::string& back_shape, const std::string& x, int64_t rank) {
  if (rank < 3) return false;
  const int last = static_cast<int>(rank) - 1;
  std::vector<int> back;
  for (int axis = 0; axis < last - 1; ++axis) back.push_back(axis);
  back.push_back(last);
  back.push_back(last - 1);
  return ShapeValueIs(graph, shapes, flat_shape, x, {kMinusOne, last - 1, last}) &&
         ShapeValueIs(graph, shapes, back_shape, x, back);
}

// The rank of `x`: from inferred shapes, or from the Transpose that made it.
std::optional<int64_t> RankOf(const Graph& graph, const ShapeInfo& shapes, const std::string& x) {
  if (auto rank = shapes.Rank(x)) return *rank;
  if (Node* transpose = ProducerWithOp(graph, x, "Transpose")) {
    if (const onnx::AttributeProto* perm = transpose->FindAttribute("perm")) return perm->ints_size();
  }
  return std::nullopt;
}

class CanonicalizeSwapLastAxesPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_swap_last_axes"; }
  absl::string_view description() const override {
    return "Turn Reshape to 3-D -> Transpose -> Reshape back (dynamo's transpose(-2, -1)) into one Transpose of the "
           "last two axes";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    for (Node* back : graph.Nodes()) {
      if (back->removed() || back->op_type() != "Reshape" || !back->domain().empty()) continue;
      Node* transpose = ProducerWithOp(graph, back->input(0), "Transpose");
      const onnx::AttributeProto* perm = transpose ? transpose->FindAttribute("perm") : nullptr;
      if (perm == nullptr || std::vector<int64_t>(perm->ints().begin(), perm->ints().end()) != std::vector<int64_t>{0, 2, 1}) {
        continue;
      }
      Node* flat = ProducerWithOp(graph, transpose->input(0), "Reshape");
      if (flat == nullptr || SoleConsumer(graph, flat->output(0)) != transpose ||
          SoleConsumer(graph, transpose->output(0)) != back) {
        continue;
      }
      const std::string& x = flat->input(0);
      const std::optional<int64_t> rank = RankOf(graph, shapes, x);
      const bool sliced =
          MatchPieces(graph, flat->input(1), /*lead_minus_one=*/true, x, {{-2, -1}, {-1, kToEnd}}) &&
          MatchPieces(graph, back->input(1), /*lead_minus_one=*/false, x, {{kFromStart, -2}, {-1, kToEnd}, {-2, -1}});
      if (!sliced && !(rank && SwapsAsValues(graph, shapes, flat->input(1), back->input(1), x, *rank))) continue;
      if (!rank || *rank < 3) {
        context.Skip("canonicalize_swap_last_axes: the rank of the reshaped tensor is unknown");
        continue;
      }
      onnx::NodeProto swap = MakeNode(
          "Transpose", graph.UniqueName(back->name().empty() ? "swap_last_axes" : back->name() + "_swap_last_axes"),
          {x}, {back->output(0)});
      std::vector<int64_t> order;
      for (int64_t axis = 0; axis < *rank - 2; ++axis) order.push_back(axis);
      order.push_back(*rank - 1);
      order.push_back(*rank - 2);
      *swap.add_attribute() = MakeIntsAttribute("perm", order);
      graph.RemoveNode(back);
      graph.RemoveNode(transpose);
      graph.RemoveNode(flat);
      graph.AddNode(std::move(swap), back, /*after=*/true);
      context.CountRewrite();  // the shape arithmetic left unread goes with the dead-node cleanup
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeSwapLastAxesPass() { return std::make_unique<CanonicalizeSwapLastAxesPass>(); }

}  // namespace onnxopt
