// canonicalize_interleaved_qkv: Megatron-LM (and GPT-NeoX, BLOOM) pack Q, K and V per head: the
// projection's columns hold [q_0 k_0 v_0 q_1 k_1 v_1 ...], one D-wide piece each, and the model splits
// them after the head split. Its weight's columns reordered to [Q | K | V] give the packed form the
// attention fusion reads (a Split of the last axis, then a head Reshape per part).
//
// Before:  x = MatMul(h, W[I, 3ND]) (+ b[3ND]);  y = Reshape(x, [B, S, N, 3D]);  q, k, v = Split(y, axis=-1, [D, D, D])
// After:   x' = MatMul(h, W') (+ b');  x'_p = Split(x', axis=-1, [ND, ND, ND])_p;  q, k, v = Reshape(x'_p, [0, 0, N, D])
//          with W'[:, p N D + n D + d] = W[:, n 3D + p D + d] (b' alike)
// Checked: W (and b) constant floats of 3ND columns, N and 3D the Reshape's last two dims (constants), the
// Split three equal parts of its last axis; x, y and the MatMul (and Add) read by nothing else, so the
// reordered weights serve the pattern alone.
#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

struct InterleavedQkv {
  Node* matmul = nullptr;
  Node* bias_add = nullptr;  // null: no bias
  int bias_side = 1;         // the Add's constant operand
  Node* reshape = nullptr;
  Node* split = nullptr;
  int64_t heads = 0, head_size = 0;
};

// The Split's part sizes: its input, its attribute or, with neither, equal parts.
std::optional<std::vector<int64_t>> SplitSizes(const Graph& graph, const Node& split) {
  if (split.input_size() > 1 && !split.input(1).empty()) return ConstantInts(graph, split.input(1));
  if (const onnx::AttributeProto* attribute = split.FindAttribute("split")) {
    return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
  }
  return std::vector<int64_t>();
}

MatchResult<InterleavedQkv> MatchInterleavedQkv(const Graph& graph, const ShapeInfo& shapes, Node* split) {
  if (split->op_type() != "Split" || !split->domain().empty() || split->output_size() != 3) return Fail();
  const int64_t axis = split->GetAttributeInt("axis", 0);
  Node* reshape = ProducerWithOp(graph, split->input(0), "Reshape");
  if ((axis != -1 && axis != 3) || reshape == nullptr || shapes.Rank(split->input(0)) != 4) return Fail();
  const std::optional<int64_t> heads = shapes.DimValue(split->input(0), 2);
  const std::optional<int64_t> packed = shapes.DimValue(split->input(0), 3);
  if (!heads || !packed || *heads < 2 || *packed % 3 != 0) return Fail();
  const int64_t head_size = *packed / 3;
  const std::optional<std::vector<int64_t>> sizes = SplitSizes(graph, *split);
  if (!sizes || !(sizes->empty() || *sizes == std::vector<int64_t>{head_size, head_size, head_size})) return Fail();
  InterleavedQkv match;
  match.reshape = reshape;
  match.split = split;
  match.heads = *heads;
  match.head_size = head_size;
  std::string x = reshape->input(0);
  if (Node* add = ProducerWithOp(graph, x, "Add"); add != nullptr) {
    const std::optional<int> side = FindOperand(*add, [&](const std::string& operand) {
      const onnx::TensorProto* b = ConstantTensor(graph, operand);
      return b != nullptr && b->dims_size() == 1 && b->dims(0) == 3 * *heads * head_size &&
             b->data_type() == onnx::TensorProto::FLOAT;
    });
    if (!side) return Fail("an interleaved Q/K/V projection's bias is not a constant of its width");
    match.bias_add = add;
    match.bias_side = *side;
    x = OtherInput(*add, *side);
  }
  Node* matmul = ProducerWithOp(graph, x, "MatMul");
  const onnx::TensorProto* weight = matmul != nullptr ? ConstantTensor(graph, matmul->input(1)) : nullptr;
  if (weight == nullptr || weight->dims_size() != 2 || weight->dims(1) != 3 * *heads * head_size ||
      weight->data_type() != onnx::TensorProto::FLOAT) {
    return Fail("an interleaved Q/K/V split is not of a constant projection");
  }
  match.matmul = matmul;
  for (const std::string* value : {&matmul->output(0), &reshape->input(0), &split->input(0)}) {
    if (graph.IsGraphOutput(*value) || graph.Consumers(*value).size() != 1) {
      return Fail("an interleaved Q/K/V projection is read elsewhere");
    }
  }
  return match;
}

// Columns [n 3D + p D + d] -> [p N D + n D + d] of a row-major [rows, 3 N D] matrix (rows 1: a bias).
std::vector<float> PartsFirst(const std::vector<float>& values, int64_t rows, int64_t heads, int64_t head_size) {
  const int64_t width = 3 * heads * head_size;
  std::vector<float> reordered(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < heads; ++n) {
      for (int64_t p = 0; p < 3; ++p) {
        for (int64_t d = 0; d < head_size; ++d) {
          reordered[r * width + p * heads * head_size + n * head_size + d] =
              values[r * width + n * 3 * head_size + p * head_size + d];
        }
      }
    }
  }
  return reordered;
}

void RewriteInterleavedQkv(Graph& graph, PassContext& context, const InterleavedQkv& match) {
  const int64_t part = match.heads * match.head_size;
  auto reorder = [&](const std::string& name, int64_t rows, std::vector<int64_t> dims) {
    const std::vector<float> values = *TensorFloats(*ConstantTensor(graph, name));
    const std::string reordered = graph.UniqueName(name + "_parts_first");
    graph.AddInitializer(MakeFloatTensor(reordered, dims, PartsFirst(values, rows, match.heads, match.head_size)));
    return reordered;
  };
  const onnx::TensorProto* weight = ConstantTensor(graph, match.matmul->input(1));
  const int64_t rows = weight->dims(0);
  graph.SetInput(match.matmul, 1, reorder(match.matmul->input(1), rows, {rows, 3 * part}));
  if (match.bias_add != nullptr) {
    graph.SetInput(match.bias_add, match.bias_side, reorder(match.bias_add->input(match.bias_side), 1, {3 * part}));
  }
  const std::vector<std::string> outputs = {match.split->output(0), match.split->output(1), match.split->output(2)};
  SplitPartsIntoHeads(graph, match.reshape->input(0), part, match.heads, match.head_size, outputs,
                      context.OpsetVersion(""), match.reshape);
  graph.RemoveNode(match.split);
  graph.RemoveNode(match.reshape);
  context.CountRewrite();
}

class CanonicalizeInterleavedQkvPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "canonicalize_interleaved_qkv"; }
  absl::string_view description() const override {
    return "Reorder a projection that packs Q, K and V per head (Megatron, GPT-NeoX: Reshape to [B,S,N,3D], Split) "
           "into the [Q | K | V] packed form the attention fusion reads";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    RewriteEachMatch(
        graph, context, "canonicalize_interleaved_qkv: ",
        [&](Node* node) { return MatchInterleavedQkv(graph, shapes, node); },
        [&](const InterleavedQkv& match) { RewriteInterleavedQkv(graph, context, match); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCanonicalizeInterleavedQkvPass() { return std::make_unique<CanonicalizeInterleavedQkvPass>(); }

}  // namespace onnxopt
