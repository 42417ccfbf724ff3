#include "optimizer/passes/fusion/rotary.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// The input of Unsqueeze(value, axes=[axis]).
std::optional<std::string> UnsqueezedOn(const Graph& graph, const std::string& value, int64_t axis) {
  Node* unsqueeze = ProducerWithOp(graph, value, "Unsqueeze");
  if (unsqueeze == nullptr) return std::nullopt;
  std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, *unsqueeze);
  if (!axes || *axes != std::vector<int64_t>{axis}) return std::nullopt;
  return unsqueeze->input(0);
}

// Slice(x, [start], [end], [last axis of 4], [1]): start and end.
std::optional<std::pair<int64_t, int64_t>> LastAxisSlice(const Graph& graph, const Node* slice) {
  if (slice == nullptr || slice->input_size() < 4) return std::nullopt;  // the axis is given
  const std::optional<SliceSpec> spec = ParseSlice(graph, *slice);
  if (!spec || !spec->starts || !spec->ends || !spec->OneAxis(-1, 4)) return std::nullopt;
  return std::make_pair((*spec->starts)[0], (*spec->ends)[0]);
}

// The rotated operand of a rotation's sin term: x, half of D, the nodes that rotate, and which rotation.
struct RotatedPart {
  std::string x;
  int64_t half = 0;
  std::vector<Node*> nodes;
  bool interleaved = false;
};

// rotate_half(x) = Concat(Neg(Slice(x, h, end)), Slice(x, 0, h)) on the last axis.
std::optional<RotatedPart> RotatedHalf(const Graph& graph, const std::string& value) {
  Node* concat = ProducerWithOp(graph, value, "Concat");
  if (concat == nullptr || concat->input_size() != 2) return std::nullopt;
  const int64_t axis = concat->GetAttributeInt("axis", 0);
  Node* neg = ProducerWithOp(graph, concat->input(0), "Neg");
  Node* low = ProducerWithOp(graph, concat->input(1), "Slice");
  Node* high = neg != nullptr ? ProducerWithOp(graph, neg->input(0), "Slice") : nullptr;
  const auto low_range = LastAxisSlice(graph, low);
  const auto high_range = LastAxisSlice(graph, high);
  if ((axis != -1 && axis != 3) || !low_range || !high_range || low->input(0) != high->input(0) ||
      low_range->first != 0 || low_range->second <= 0 || high_range->first != low_range->second ||
      high_range->second < 2 * low_range->second) {
    return std::nullopt;
  }
  return RotatedPart{low->input(0), low_range->second, {concat, neg, low, high}, false};
}

// The input of Unsqueeze(value) on a new last axis of a rank-4 input (axes [-1] or [4]).
std::optional<std::string> UnsqueezedLast(const Graph& graph, const std::string& value) {
  Node* unsqueeze = ProducerWithOp(graph, value, "Unsqueeze");
  if (unsqueeze == nullptr) return std::nullopt;
  std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, *unsqueeze);
  if (!axes || (*axes != std::vector<int64_t>{-1} && *axes != std::vector<int64_t>{4})) return std::nullopt;
  return unsqueeze->input(0);
}

// Slice(x, [start], [end >= width], [last axis of 4], [2]): its start (0: the even elements, 1: the odd).
std::optional<int64_t> EveryOtherOnLastAxis(const Graph& graph, const Node* slice, int64_t width) {
  if (slice == nullptr || slice->input_size() < 5) return std::nullopt;
  const std::optional<SliceSpec> spec = ParseSlice(graph, *slice);
  if (!spec || !spec->starts || !spec->ends || spec->axes.size() != 1 || spec->steps.size() != 1 ||
      spec->steps[0] != 2 || (spec->axes[0] != -1 && spec->axes[0] != 3) || (*spec->ends)[0] < width) {
    return std::nullopt;
  }
  return (*spec->starts)[0];
}

// rotate_every_two(x) = Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1), -1)) back to
// x's shape [B,N,S,D] (GPT-J's torch.stack((-x2, x1), dim=-1).flatten(-2)).
std::optional<RotatedPart> RotatedEveryTwo(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  Node* reshape = ProducerWithOp(graph, value, "Reshape");
  Node* concat = reshape != nullptr ? ProducerWithOp(graph, reshape->input(0), "Concat") : nullptr;
  if (concat == nullptr || concat->input_size() != 2) return std::nullopt;
  const int64_t axis = concat->GetAttributeInt("axis", 0);
  const std::optional<std::string> negated = UnsqueezedLast(graph, concat->input(0));
  const std::optional<std::string> even = UnsqueezedLast(graph, concat->input(1));
  Node* neg = negated ? ProducerWithOp(graph, *negated, "Neg") : nullptr;
  Node* odd_slice = neg != nullptr ? ProducerWithOp(graph, neg->input(0), "Slice") : nullptr;
  Node* even_slice = even ? ProducerWithOp(graph, *even, "Slice") : nullptr;
  if ((axis != -1 && axis != 4) || odd_slice == nullptr || even_slice == nullptr ||
      odd_slice->input(0) != even_slice->input(0)) {
    return std::nullopt;
  }
  const std::string& x = odd_slice->input(0);
  const std::optional<int64_t> width = shapes.DimValue(x, 3);
  if (shapes.Rank(x) != 4 || !width || *width % 2 != 0 || EveryOtherOnLastAxis(graph, odd_slice, *width) != 1 ||
      EveryOtherOnLastAxis(graph, even_slice, *width) != 0 || !shapes.SameShape(value, x)) {
    return std::nullopt;
  }
  return RotatedPart{x,
                     *width / 2,
                     {reshape, concat, graph.Producer(concat->input(0)), graph.Producer(concat->input(1)), neg,
                      odd_slice, even_slice},
                     true};
}

// The table a rotation multiplies the heads [B,N,S,D] by, and its rank: Unsqueeze(t [B',S,D], [1]) is
// t (rank 3); a [B'|1, 1, S, D] value (a stored [1,1,P,D] buffer sliced, `emb.cos()[None, None]`) and an
// [S, D] value broadcast as it is are themselves (ranks 4 and 2).
std::optional<std::pair<std::string, int>> TableOnHeads(const Graph& graph, const ShapeInfo& shapes,
                                                         const std::string& operand) {
  if (std::optional<std::string> table = UnsqueezedOn(graph, operand, 1)) return std::make_pair(*table, 3);
  const std::optional<int> rank = shapes.Rank(operand);
  if (rank == 4 && shapes.DimValue(operand, 1) == 1) return std::make_pair(operand, 4);
  if (rank == 2) return std::make_pair(operand, 2);
  return std::nullopt;
}

std::optional<Rotation> MatchElementWise(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  Rotation rotation;
  // Add(x * cos, rotate(x) * sin): the sin term is the Mul that reads a rotated x.
  std::optional<PathMatch> path = MatchPath(
      graph, value, {{"Add", kAnyInput}, {"Mul", kAnyInput}}, [&](const PathMatch& found) {
        std::optional<RotatedPart> rotated = RotatedHalf(graph, found.end);
        if (!rotated) rotated = RotatedEveryTwo(graph, shapes, found.end);
        if (!rotated) return false;
        Node* with_cos = ProducerWithOp(graph, found.Other(0), "Mul");
        if (with_cos == nullptr) return false;
        const std::optional<int> heads = FindOperand(*with_cos, [&](const std::string& operand) {
          return operand == rotated->x;
        });
        if (!heads) return false;
        auto cos = TableOnHeads(graph, shapes, OtherInput(*with_cos, *heads));
        auto sin = TableOnHeads(graph, shapes, found.Other(1));
        if (!cos || !sin || cos->second != sin->second) return false;
        rotation.heads = rotated->x;
        rotation.half = rotated->half;
        rotation.interleaved = rotated->interleaved;
        rotation.cos = cos->first;
        rotation.sin = sin->first;
        rotation.table_rank = cos->second;
        rotation.nodes = {found.nodes[0], found.nodes[1], with_cos};
        rotation.nodes.insert(rotation.nodes.end(), rotated->nodes.begin(), rotated->nodes.end());
        return true;
      });
  if (!path) return std::nullopt;
  return rotation;
}

// An Add with a Mul operand that reads a Concat of a Neg (or a Reshape of a Concat of an Unsqueezed Neg):
// what a rotation looks like before its details are checked.
bool LooksRotated(const Graph& graph, const std::string& value) {
  return MatchPath(graph, value, {{"Add", kAnyInput}, {"Mul", kAnyInput}, {"Concat"}, {"Neg"}}).has_value() ||
         MatchPath(graph, value, {{"Add", kAnyInput}, {"Mul", kAnyInput}, {"Reshape"}, {"Concat"}, {"Unsqueeze"}, {"Neg"}})
             .has_value();
}

}  // namespace

namespace {

MatchResult<Rotation> MatchWholeRotation(const Graph& graph, const ShapeInfo& shapes, const std::string& value);

// Concat(rotate(Slice(x, 0, r)), Slice(x, r, end)) on the last axis.
std::optional<Rotation> MatchPartialRotation(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  Node* concat = ProducerWithOp(graph, value, "Concat");
  if (concat == nullptr || concat->input_size() != 2) return std::nullopt;
  const int64_t axis = concat->GetAttributeInt("axis", 0);
  Node* rest = ProducerWithOp(graph, concat->input(1), "Slice");
  const auto rest_range = LastAxisSlice(graph, rest);
  if ((axis != -1 && axis != 3) || !rest_range) return std::nullopt;
  MatchResult<Rotation> rotation = MatchWholeRotation(graph, shapes, concat->input(0));
  if (!rotation) return std::nullopt;
  Node* first = ProducerWithOp(graph, rotation->heads, "Slice");
  const auto first_range = LastAxisSlice(graph, first);
  constexpr int64_t kToEnd = int64_t{1} << 40;
  if (!first_range || first->input(0) != rest->input(0) || first_range->first != 0 || first_range->second <= 0 ||
      rest_range->first != first_range->second || rest_range->second < kToEnd) {
    return std::nullopt;
  }
  rotation->rotary_dim = first_range->second;
  rotation->heads = first->input(0);
  rotation->nodes.insert(rotation->nodes.end(), {concat, first, rest});
  return *std::move(rotation);
}

}  // namespace

MatchResult<Rotation> MatchRotation(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  if (std::optional<Rotation> partial = MatchPartialRotation(graph, shapes, value)) return *std::move(partial);
  return MatchWholeRotation(graph, shapes, value);
}

namespace {

MatchResult<Rotation> MatchWholeRotation(const Graph& graph, const ShapeInfo& shapes, const std::string& value) {
  Node* fused = graph.Producer(value);
  if (fused != nullptr && fused->op_type() == "RotaryEmbedding" && fused->domain() == "com.microsoft") {
    if (fused->input_size() != 4 || fused->GetAttributeInt("rotary_embedding_dim", 0) != 0 ||
        fused->GetAttributeInt("num_heads", 0) != 0 || fused->GetAttributeInt("is_packed_batching", 0) != 0 ||
        fused->FindAttribute("scale") != nullptr) {
      return Fail("a RotaryEmbedding in a form not taken here (partial, packed or scaled)");
    }
    Rotation rotation;
    rotation.interleaved = fused->GetAttributeInt("interleaved", 0) != 0;
    rotation.nodes = {fused};
    rotation.fused = fused;
    rotation.heads = fused->input(0);
    rotation.position_ids = fused->input(1);
    rotation.cos_cache = fused->input(2);
    rotation.sin_cache = fused->input(3);
    return rotation;
  }
  if (std::optional<Rotation> rotation = MatchElementWise(graph, shapes, value)) return *std::move(rotation);
  if (LooksRotated(graph, value)) return Fail("rotary position embeddings in a form not recognized");
  return Fail();
}

}  // namespace

namespace {

// True if `node` (an Unsqueeze, Squeeze, Slice or Gather) leaves the last axis of its input the last axis
// of its output, whole: axes added or removed before it, rows cut or gathered on other axes.
bool KeepsLastAxis(const Graph& graph, const ShapeInfo& shapes, const Node& node) {
  if (node.input_size() == 0) return false;  // a Constant: what the table is made of
  const std::optional<int> rank = shapes.Rank(node.output(0));
  const std::optional<int> input_rank = shapes.Rank(node.input(0));
  if (node.op_type() == "Squeeze") {
    const std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, node);
    if (!axes || axes->empty() || !input_rank) return false;
    return std::all_of(axes->begin(), axes->end(), [&](int64_t axis) { return axis != -1 && axis != *input_rank - 1; });
  }
  if (node.op_type() == "Gather") {
    const int64_t axis = node.GetAttributeInt("axis", 0);
    return input_rank && *input_rank >= 2 && axis != -1 && axis != *input_rank - 1;
  }
  if (node.op_type() == "Unsqueeze") {
    const std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, node);
    if (!axes || !rank) return false;
    return std::all_of(axes->begin(), axes->end(), [&](int64_t axis) { return axis >= 0 && axis < *rank - 1; });
  }
  if (node.op_type() != "Slice" || node.input_size() < 4 || !rank) return false;
  const std::optional<SliceSpec> spec = ParseSlice(graph, node);
  return spec && std::all_of(spec->axes.begin(), spec->axes.end(), [&](int64_t axis) {
           return axis != -1 && axis != *rank - 1;
         });
}

// True if every row of the float constant's last axis repeats its first half.
bool HalvesRepeat(const onnx::TensorProto& tensor) {
  if (tensor.dims_size() < 1 || tensor.dims(tensor.dims_size() - 1) % 2 != 0) return false;
  const std::optional<std::vector<float>> values = TensorFloats(tensor);
  const size_t width = static_cast<size_t>(tensor.dims(tensor.dims_size() - 1)), half = width / 2;
  if (!values || values->empty() || width == 0 || values->size() % width != 0) return false;
  for (size_t row = 0; row < values->size(); row += width) {
    for (size_t i = 0; i < half; ++i) {
      if ((*values)[row + i] != (*values)[row + i + half]) return false;
    }
  }
  return true;
}

// What `table` is made of behind Casts to float, scalar scales and nodes that keep its last axis whole:
// they change no row's pattern along the last axis.
std::string BehindRowKeepers(const Graph& graph, const ShapeInfo& shapes, const std::string& table) {
  std::string value = table;
  for (int depth = 0; depth < 8; ++depth) {
    Node* node = graph.Producer(value);
    if (node == nullptr || !node->domain().empty()) break;
    if (node->op_type() == "Cast" && node->GetAttributeInt("to", 0) == onnx::TensorProto::FLOAT) {
      value = node->input(0);
    } else if (auto scaled = ScalarScale(graph, node)) {
      value = scaled->second;
    } else if (KeepsLastAxis(graph, shapes, *node)) {
      value = node->input(0);
    } else {
      break;
    }
  }
  return value;
}

// True if every pair (2i, 2i + 1) of the float constant's last axis holds one value twice.
bool PairsRepeat(const onnx::TensorProto& tensor) {
  if (tensor.dims_size() < 1 || tensor.dims(tensor.dims_size() - 1) % 2 != 0) return false;
  const std::optional<std::vector<float>> values = TensorFloats(tensor);
  if (!values || values->empty()) return false;
  for (size_t i = 0; i + 1 < values->size(); i += 2) {
    if ((*values)[i] != (*values)[i + 1]) return false;
  }
  return true;
}

}  // namespace

bool IsDuplicatedPairTable(const Graph& graph, const ShapeInfo& shapes, const std::string& table) {
  const std::string value = BehindRowKeepers(graph, shapes, table);
  if (const onnx::TensorProto* stored = ConstantTensor(graph, value)) return PairsRepeat(*stored);
  // Reshape(Concat(Unsqueeze(t, -1), Unsqueeze(t, -1), -1)) back to t's rank: [.., h] -> [.., h, 2] -> [.., 2h].
  Node* reshape = ProducerWithOp(graph, value, "Reshape");
  Node* concat = reshape != nullptr ? ProducerWithOp(graph, reshape->input(0), "Concat") : nullptr;
  if (concat == nullptr || concat->input_size() != 2 || concat->input(0) != concat->input(1)) return false;
  Node* unsqueeze = ProducerWithOp(graph, concat->input(0), "Unsqueeze");
  if (unsqueeze == nullptr) return false;
  const std::string& t = unsqueeze->input(0);
  const std::optional<int> rank = shapes.Rank(t);
  const std::optional<std::vector<int64_t>> axes = ConstantAxes(graph, *unsqueeze);
  const int64_t axis = concat->GetAttributeInt("axis", 0);
  if (!rank || !axes || (*axes != std::vector<int64_t>{-1} && *axes != std::vector<int64_t>{*rank}) ||
      (axis != -1 && axis != *rank) || shapes.Rank(value) != rank) {
    return false;
  }
  // The Reshape merges only the pair axis into the last: every leading dim stays, the last doubles.
  for (int d = 0; d + 1 < *rank; ++d) {
    if (!shapes.SameDim(value, d, t, d)) return false;
  }
  const std::optional<int64_t> half = shapes.DimValue(t, -1);
  return half && shapes.DimValue(value, -1) == 2 * *half;
}

bool IsDuplicatedHalfTable(const Graph& graph, const ShapeInfo& shapes, const std::string& table, const char* op) {
  const std::string value = BehindRowKeepers(graph, shapes, table);
  // A stored table (transformers' cos_cached buffers, sliced to the length).
  if (const onnx::TensorProto* stored = ConstantTensor(graph, value)) return HalvesRepeat(*stored);
  Node* trig = ProducerWithOp(graph, value, op);
  Node* concat = trig != nullptr ? ProducerWithOp(graph, trig->input(0), "Concat") : nullptr;
  if (concat == nullptr || concat->input_size() != 2 || concat->input(0) != concat->input(1)) return false;
  std::optional<int> rank = shapes.Rank(concat->input(0));
  if (Node* transpose = ProducerWithOp(graph, concat->input(0), "Transpose"); !rank && transpose != nullptr) {
    rank = static_cast<int>(PermOf(transpose).size());
  }
  const int64_t axis = concat->GetAttributeInt("axis", 0);
  return rank && *rank >= 1 && (axis == -1 || axis == *rank - 1);
}

std::optional<StoredTable> MatchStoredTable(const Graph& graph, const std::string& value) {
  Node* gather = ProducerWithOp(graph, value, "Gather");
  if (gather == nullptr || gather->GetAttributeInt("axis", 0) != 0) return std::nullopt;
  std::string table = gather->input(0);
  // cos_cached[:S]: a Slice of the rows from 0 reads the same rows at every id the original accepts.
  if (Node* slice = ProducerWithOp(graph, table, "Slice")) {
    const std::optional<SliceSpec> spec = ParseSlice(graph, *slice);
    if (!spec || !spec->starts || !spec->OneAxis(0, 2) || (*spec->starts)[0] != 0) return std::nullopt;
    table = slice->input(0);
  }
  const onnx::TensorProto* tensor = ConstantTensor(graph, table);
  if (tensor == nullptr || tensor->dims_size() != 2 || !HalvesRepeat(*tensor)) return std::nullopt;
  return StoredTable{tensor, gather->input(1)};
}

namespace {

// The first half of `table` computed directly where `table` is Cos or Sin of Concat(f, f) on the last
// axis (Hugging Face's emb = cat((freqs, freqs), -1)): the same op on f, half the elements and no Slice;
// nullopt for another table.
std::optional<std::string> FirstHalfOfDuplicatedAngles(Graph& graph, const ShapeInfo& shapes,
                                                       const std::string& table, int64_t half, NodeChain* chain) {
  const Node* trig = graph.Producer(table);
  if (trig == nullptr || !trig->domain().empty() || (trig->op_type() != "Cos" && trig->op_type() != "Sin")) {
    return std::nullopt;
  }
  const Node* concat = ProducerWithOp(graph, trig->input(0), "Concat");
  if (concat == nullptr || concat->input_size() != 2 || concat->input(0) != concat->input(1)) return std::nullopt;
  const std::string& angles = concat->input(0);
  const std::optional<int> rank = shapes.Rank(angles);
  const int64_t axis = concat->GetAttributeInt("axis", 0);
  if (!rank || (axis != -1 && axis != *rank - 1) || shapes.DimValue(angles, -1) != half) return std::nullopt;
  const std::string op(trig->op_type());
  return chain->Add(op, {angles}, absl::StrCat("rotary_", absl::AsciiStrToLower(op), "_of_angles"));
}

// RotaryEmbedding's inputs for stored tables: their first halves as constants, the Gather's ids.
RotaryInputs StoredInputs(Graph& graph, const StoredTables& stored) {
  auto first_halves = [&](const StoredTable& stored, const std::string& hint) {
    const std::vector<float> values = *TensorFloats(*stored.table);
    const int64_t rows = stored.table->dims(0), width = stored.table->dims(1);
    std::vector<float> halves;
    halves.reserve(static_cast<size_t>(rows * width / 2));
    for (int64_t r = 0; r < rows; ++r) {
      halves.insert(halves.end(), values.begin() + r * width, values.begin() + r * width + width / 2);
    }
    const std::string name = graph.UniqueName(hint);
    graph.AddInitializer(MakeFloatTensor(name, {rows, width / 2}, halves));
    return name;
  };
  return {stored.cos.ids, first_halves(stored.cos, "rotary_cos_cache"), first_halves(stored.sin, "rotary_sin_cache")};
}

}  // namespace

const RotaryInputs& RotaryInputsFor(Graph& graph, const ShapeInfo& shapes, const Rotation& rotation,
                                    const std::optional<StoredTables>& stored,
                                    std::map<std::string, RotaryInputs>* cache, const Node** at) {
  RotaryInputs& shared = (*cache)[absl::StrCat(rotation.cos, "\n", rotation.sin, rotation.interleaved ? "\ni" : "")];
  if (!shared.cos_cache.empty()) return shared;
  if (stored) {
    shared = StoredInputs(graph, *stored);
    return shared;
  }
  NodeChain chain(graph, *at);
  const std::string zero = AddInt64Initializer(graph, "rotary_zero", {0});
  const std::string half = AddInt64Initializer(graph, "rotary_half", {rotation.half});
  const std::string last = AddInt64Initializer(graph, "rotary_axis", {-1});
  const std::string rows_shape = AddInt64Initializer(graph, "rotary_cache_rows", {-1, rotation.half});
  // The first halves of the rows, or their even elements for an interleaved rotation.
  std::vector<std::string> distinct_part = {zero, half, last};
  if (rotation.interleaved) {
    distinct_part = {zero, AddInt64Initializer(graph, "rotary_end", {std::numeric_limits<int64_t>::max()}), last,
                     AddInt64Initializer(graph, "rotary_every_other", {2})};
  }
  auto cache_of = [&](const std::string& table, const std::string& hint) {
    if (!rotation.interleaved) {
      if (auto first_half = FirstHalfOfDuplicatedAngles(graph, shapes, table, rotation.half, &chain)) {
        return chain.Add("Reshape", {*first_half, rows_shape}, hint);
      }
    }
    std::vector<std::string> slice = {table};
    slice.insert(slice.end(), distinct_part.begin(), distinct_part.end());
    const std::string distinct = chain.Add("Slice", std::move(slice), hint + (rotation.interleaved ? "_even" : "_half"));
    return chain.Add("Reshape", {distinct, rows_shape}, hint);
  };
  shared.cos_cache = cache_of(rotation.cos, "rotary_cos_cache");
  shared.sin_cache = cache_of(rotation.sin, "rotary_sin_cache");
  auto batch_shared = [&](const std::string& table) {
    return rotation.table_rank == 2 || shapes.DimValue(table, 0) == 1;
  };
  if (batch_shared(rotation.cos) && batch_shared(rotation.sin)) {
    // B' = 1 (positions shared by the batch, Hugging Face's arange): row s, RotaryEmbedding's
    // position offset form.
    shared.position_ids = zero;
  } else {
    const std::string one = AddInt64Initializer(graph, "rotary_one", {1});
    const std::string two = AddInt64Initializer(graph, "rotary_two", {2});
    const std::string three = AddInt64Initializer(graph, "rotary_three", {3});
    const std::string rows = chain.Add("Gather", {chain.Add("Shape", {shared.cos_cache}, "rotary_cache_shape"),
                                                  AddInt64Scalar(graph, "rotary_rows_index", 0)},
                                       "rotary_cache_rows_count", {MakeIntAttribute("axis", 0)});
    const std::string row_ids =
        chain.Add("Range", {AddInt64Scalar(graph, "rotary_range_start", 0), rows,
                            AddInt64Scalar(graph, "rotary_range_step", 1)},
                  "rotary_row_ids");
    // B and S of the heads [B,N,S,D].
    const std::string heads_shape = chain.Add("Shape", {rotation.heads}, "rotary_heads_shape");
    const std::string batch = chain.Add("Slice", {heads_shape, zero, one}, "rotary_batch");
    const std::string length = chain.Add("Slice", {heads_shape, two, three}, "rotary_length");
    const std::string batch_and_length =
        chain.Add("Concat", {batch, length}, "rotary_batch_and_length", {MakeIntAttribute("axis", 0)});
    const std::string by_length =
        chain.Add("Concat", {last, length}, "rotary_rows_by_length", {MakeIntAttribute("axis", 0)});
    const std::string table_positions = chain.Add("Reshape", {row_ids, by_length}, "rotary_table_positions");
    shared.position_ids = chain.Add("Expand", {table_positions, batch_and_length}, "rotary_position_ids");
  }
  *at = chain.last();
  return shared;
}

}  // namespace onnxopt
