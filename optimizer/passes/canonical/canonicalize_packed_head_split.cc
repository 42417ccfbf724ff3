// canonicalize_packed_head_split: ModernBERT (and other packed-QKV models written with view/unbind)
// splits its packed projection into heads before it splits it into Q, K and V: Reshape to
// [B, S, P, N, D], Split on the P axis into ones, Squeeze. The same values come from splitting the
// last axis into P parts first and reshaping each part to heads, the form the attention fusion reads
// as parts of a packed projection (attention_match.h).
//
// Before:  y = Reshape(x [B,S,P*N*D], [B, S, P, n, d]);
//          y_i = Squeeze(Split(y, axis=2 or -3, [1]*P)_i, [2 or -3])   (TorchScript's unbind)
//          y_i = Squeeze(Slice(y, [i], [i+1], [2 or -3]), [2 or -3])     (dynamo's)
// After:   x_i = Split(x, axis=-1, [N*D]*P)_i;  y_i = Reshape(x_i, [0, 0, n, d])
// Checked: x has rank 3 and a known last axis divisible by P; the target's first two elements are B and S
// of x (0, or the same number or named dim), its third is P, n and d are constants (at most one -1, no 0);
// the Split takes equal ones of that axis (or the Slices take each index of it once) and every part is
// squeezed on it alone; the 5-D value and the parts have no other reader. The same on every input: a
// row-major Reshape of the last axis into [P, n, d] puts part p at offsets [p*n*d, (p+1)*n*d).
#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// True if the Split `split` of a rank-5 value cuts axis 2 into `parts` ones.
bool SplitsIntoOnes(const Graph& graph, const Node& split, int64_t parts) {
  int64_t axis = split.GetAttributeInt("axis", 0);
  if (axis < 0) axis += 5;
  if (axis != 2 || split.output_size() != parts) return false;
  std::optional<std::vector<int64_t>> sizes;
  if (split.input_size() > 1 && !split.input(1).empty()) {
    sizes = ConstantInts(graph, split.input(1));
  } else if (const onnx::AttributeProto* attribute = split.FindAttribute("split")) {
    sizes = std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
  } else {
    return true;  // an equal split of P into P outputs
  }
  return sizes && *sizes == std::vector<int64_t>(static_cast<size_t>(parts), 1);
}

// The parts, in order, that the readers of the rank-5 `value` cut from its axis 2: the outputs of one
// Split into ones, or P Slices of width 1 that take each index once. `cutters` gets those nodes.
std::optional<std::vector<std::string>> Parts(const Graph& graph, const std::string& value, int64_t parts,
                                              std::vector<Node*>* cutters) {
  const std::vector<Node*> readers = graph.Consumers(value);
  if (readers.size() == 1 && readers[0]->op_type() == "Split" && readers[0]->domain().empty()) {
    if (!SplitsIntoOnes(graph, *readers[0], parts)) return std::nullopt;
    cutters->push_back(readers[0]);
    return std::vector<std::string>(readers[0]->proto().output().begin(), readers[0]->proto().output().end());
  }
  if (static_cast<int64_t>(readers.size()) != parts) return std::nullopt;
  std::vector<std::string> taken(static_cast<size_t>(parts));
  for (Node* slice : readers) {
    if (slice->op_type() != "Slice" || !slice->domain().empty() || slice->input(0) != value) return std::nullopt;
    const std::optional<SliceSpec> spec = ParseSlice(graph, *slice);
    if (!spec || !spec->starts || !spec->ends || !spec->OneAxis(2, 5)) return std::nullopt;
    const int64_t start = (*spec->starts)[0], end = (*spec->ends)[0];
    if (start < 0 || start >= parts || end != start + 1 || !taken[static_cast<size_t>(start)].empty()) {
      return std::nullopt;
    }
    taken[static_cast<size_t>(start)] = slice->output(0);
  }
  cutters->insert(cutters->end(), readers.begin(), readers.end());
  return taken;
}

// A packed head split, checked: what its rewrite replaces and writes.
struct PackedHeadSplit {
  Node* reshape = nullptr;
  std::vector<Node*> cutters, squeezes;  // the Split or Slices; one Squeeze per part, in order
  int64_t heads = 0, head_size = 0;      // the target's n and d (one may be -1)
  int64_t part_width = 0;                // N*D
};

MatchResult<PackedHeadSplit> MatchPackedHeadSplit(const Graph& graph, const ShapeInfo& shapes, Node* reshape) {
  if (reshape->op_type() != "Reshape" || !reshape->domain().empty()) return Fail();
  const std::string& x = reshape->input(0);
  const std::string& target = reshape->input(1);
  if (ShapeValueSize(graph, shapes, target) != 5u || shapes.Rank(x) != 3) return Fail();
  const std::optional<int64_t> parts = ShapeValueElement(graph, shapes, target, 2);
  if (!parts || *parts < 2) return Fail();
  PackedHeadSplit match;
  match.reshape = reshape;
  std::optional<std::vector<std::string>> part_values = Parts(graph, reshape->output(0), *parts, &match.cutters);
  if (!part_values) return Fail();
  // Every part squeezed on the split axis alone.
  for (const std::string& part : *part_values) {
    Node* squeeze = part.empty() ? nullptr : SoleConsumer(graph, part);
    std::optional<std::vector<int64_t>> axes = squeeze != nullptr && squeeze->op_type() == "Squeeze"
                                                   ? ConstantAxes(graph, *squeeze)
                                                   : std::nullopt;
    if (!axes || axes->size() != 1 || ((*axes)[0] != 2 && (*axes)[0] != -3)) return Fail();
    match.squeezes.push_back(squeeze);
  }
  const bool zero_copies = reshape->GetAttributeInt("allowzero", 0) == 0;
  auto keeps_dim = [&](size_t index) {
    return (zero_copies && ShapeValueElement(graph, shapes, target, index) == 0) ||
           ElementIsDim(graph, shapes, target, index, x, static_cast<int>(index));
  };
  const std::optional<int64_t> heads = ShapeValueElement(graph, shapes, target, 3);
  const std::optional<int64_t> head_size = ShapeValueElement(graph, shapes, target, 4);
  if (!keeps_dim(0) || !keeps_dim(1) || !heads || !head_size || *heads == 0 || *head_size == 0 ||
      (*heads == -1 && *head_size == -1) || *heads < -1 || *head_size < -1) {
    return Fail("the packed head split's target is not [B, S, P, N, D] with N and D known");
  }
  const std::optional<int64_t> width = shapes.DimValue(x, -1);
  if (!width || *width % *parts != 0) return Fail("the packed projection's width is not known");
  if (graph.IsGraphOutput(reshape->output(0))) return Fail();
  match.heads = *heads;
  match.head_size = *head_size;
  match.part_width = *width / *parts;
  return match;
}

void RewritePackedHeadSplit(Graph& graph, PassContext& context, const PackedHeadSplit& match) {
  std::vector<std::string> outputs;
  for (Node* squeeze : match.squeezes) outputs.push_back(squeeze->output(0));
  // After the 5-D Reshape, which is before every part's reader.
  SplitPartsIntoHeads(graph, match.reshape->input(0), match.part_width, match.heads, match.head_size, outputs,
                      context.OpsetVersion(""), match.reshape);
  for (Node* squeeze : match.squeezes) graph.RemoveNode(squeeze);
  for (Node* cutter : match.cutters) graph.RemoveNode(cutter);
  graph.RemoveNode(match.reshape);
  context.CountRewrite();
}

class CanonicalizePackedHeadSplitPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_packed_head_split"; }
  absl::string_view description() const override {
    return "Turn Reshape to [B,S,P,N,D] -> Split into P -> Squeeze (a packed projection split into heads first, "
           "ModernBERT's Wqkv) into a Split of the last axis and a head Reshape per part";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    RewriteEachMatch(
        graph, context, "canonicalize_packed_head_split: ",
        [&](Node* node) { return MatchPackedHeadSplit(graph, shapes, node); },
        [&](const PackedHeadSplit& match) { RewritePackedHeadSplit(graph, context, match); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizePackedHeadSplitPass() {
  return std::make_unique<CanonicalizePackedHeadSplitPass>();
}

}  // namespace onnxopt
