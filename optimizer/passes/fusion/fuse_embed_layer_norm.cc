// fuse_embed_layer_norm: BERT-style embeddings (word + position [+ token type] lookups, summed, then
// LayerNorm) become ONNX Runtime's com.microsoft::EmbedLayerNormalization.
//
// Before:  e = Gather(word[V,H], ids) + Gather(type[T,H], type_ids) + Gather(pos[P,H], position_ids)
//          (any grouping and order of the Adds);  Y = LayerNormalization(e, gamma, beta), or
//          Y = SkipLayerNormalization(a, b, gamma, beta) over lookups a, b (and Adds of them) as ONNX
//          Runtime's optimizer writes it, with e as its output 3
// After:   Y = EmbedLayerNormalization(Cast(ids, int32), Cast(type_ids, int32), word, pos, type, gamma,
//                                      beta, , Cast(position_ids, int32), epsilon)
//          with e itself, where something else reads it (GPT-2's residual stream), as output 2.
// Without a token type lookup (GPT-2) segment ids and table are left out; a lookup whose ids all hold
// one constant (transformers 5's RoBERTa reads its all-zero token_type_ids buffer, older exports fill
// one with ConstantOfShape) adds one row everywhere, which goes into a copy of the word table. Position ids that provably
// count 0..S-1 (BERT's position_ids[:, :S] of an arange buffer, GPT-2's Range(0, S)) are left out,
// which is the kernel's default; others (RoBERTa's cumulative count, position_ids given as an input)
// are passed as they are, [B,S] or [1,S].
// Checked: Gathers on axis 0 of constant float tables [*, H] with one H, the word and type ids graph
// inputs (optionally through a Cast) of one [B,S] shape, position ids [B,S] or [1,S] with that S,
// gamma/beta 1-D constants of H, normalization over the last axis, and the sum and the lookups read
// by nothing else (the sum may be, see above; a Shape of a lookup shaped like the sum reads Y instead).
#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

struct Lookup {
  Node* gather = nullptr;
  std::string table, ids;  // ids as the Gather reads them
  std::string source;      // the ids before an integer Cast (a graph input for words and types)
  int64_t rows = 0;
  std::optional<int64_t> constant_row;  // every id is this one: the lookup adds one row everywhere
};

// What the rewrite needs: the lookups by role, the sum's Adds and what else reads the lookups.
struct EmbedMatch {
  Node* norm = nullptr;
  // The pre-norm sum as a value: LayerNormalization's input, or SkipLayerNormalization's output 3 ("" where
  // it has none); the norm's scale, shift ("" for none) and epsilon.
  std::string sum, gamma, beta;
  float epsilon = 1e-5f;
  std::vector<Lookup> lookups;
  std::vector<Node*> adds;
  int word = -1, type = -1, position = -1, constant = -1;  // indexes into lookups; -1: none
  int64_t hidden = 0;
  bool counting = false;            // position ids are 0..S-1: left out
  bool sum_read_elsewhere = false;  // the sum becomes output 2
  std::vector<Node*> shape_readers;  // Shape nodes of a lookup, which read Y instead
  std::vector<float> word_plus_row;  // with a constant lookup: the word table plus its row
};

// Leaves of an Add tree rooted at `value` (each Add read only inside the tree), with its Adds.
void CollectSum(const Graph& graph, const std::string& value, int depth, std::vector<std::string>* leaves,
                std::vector<Node*>* adds) {
  Node* add = ProducerWithOp(graph, value, "Add");
  if (add == nullptr || depth > 3 || (depth > 0 && SoleConsumer(graph, value) == nullptr)) {
    leaves->push_back(value);
    return;
  }
  adds->push_back(add);
  CollectSum(graph, add->input(0), depth + 1, leaves, adds);
  CollectSum(graph, add->input(1), depth + 1, leaves, adds);
}

// The one value every element of `ids` holds, when they are gathered, expanded, sliced or reshaped
// from a constant whose elements are all that value (transformers 5's RoBERTa reads its all-zero
// token_type_ids buffer through the position ids).
std::optional<int64_t> SameConstantEverywhere(const Graph& graph, const std::string& ids, int depth = 0) {
  if (const onnx::TensorProto* constant = ConstantTensor(graph, ids)) {
    auto values = TensorInts(*constant);
    if (!values || values->empty()) return std::nullopt;
    for (int64_t v : *values) {
      if (v != values->front()) return std::nullopt;
    }
    return values->front();
  }
  const Node* producer = graph.Producer(ids);
  if (producer == nullptr || depth > 6 || !producer->domain().empty()) return std::nullopt;
  // Older exports' token_type_ids = zeros_like(input_ids): ConstantOfShape(Shape(input_ids)) of an
  // integer value (its default is a float 0, which no Gather reads as ids).
  if (producer->op_type() == "ConstantOfShape") {
    const onnx::AttributeProto* value = producer->FindAttribute("value");
    auto filled = value != nullptr && value->has_t() ? TensorInts(value->t()) : std::nullopt;
    if (!filled || filled->size() != 1) return std::nullopt;
    return filled->front();
  }
  static const std::set<std::string, std::less<>> kReadsElementsOfInput0 = {
      "Gather", "GatherElements", "GatherND", "Expand", "Slice", "Reshape", "Unsqueeze", "Squeeze",
      "Flatten", "Identity", "Cast", "Transpose"};
  if (kReadsElementsOfInput0.count(producer->op_type()) == 0) return std::nullopt;
  return SameConstantEverywhere(graph, producer->input(0), depth + 1);
}

// True if `ids` are provably 0..S-1 for S = dim 1 of `input_ids`: a prefix slice of a constant
// arange buffer (BERT's position_ids[:, :S]) or Unsqueeze(Range(0, S, 1)) (GPT-2). EmbedLayerNorm
// then needs no position ids at all.
bool PositionsCountUp(const Graph& graph, const ShapeInfo& shapes, const std::string& ids, const std::string& input_ids) {
  if (Node* slice = ProducerWithOp(graph, ids, "Slice"); slice != nullptr) {
    const onnx::TensorProto* buffer = ConstantTensor(graph, slice->input(0));
    auto values = buffer != nullptr ? TensorInts(*buffer) : std::nullopt;
    const std::optional<SliceSpec> spec = ParseSlice(graph, *slice);
    // Axes must be given: a slice over axis 0 by default does not cut the positions.
    if (!values || buffer->dims_size() != 2 || buffer->dims(0) != 1 || !spec || slice->input_size() < 4 ||
        spec->starts != std::vector<int64_t>{0} || !spec->OneAxis(1, 2) ||
        !ElementIsDim(graph, shapes, slice->input(2), 0, input_ids, 1)) {
      return false;
    }
    for (size_t i = 0; i < values->size(); ++i) {
      if ((*values)[i] != static_cast<int64_t>(i)) return false;
    }
    return true;
  }
  Node* unsqueeze = ProducerWithOp(graph, ids, "Unsqueeze");
  Node* range = unsqueeze != nullptr ? ProducerWithOp(graph, unsqueeze->input(0), "Range") : nullptr;
  if (range == nullptr) return false;
  auto axes = ConstantAxes(graph, *unsqueeze);
  auto start = ConstantInts(graph, range->input(0));
  auto delta = ConstantInts(graph, range->input(2));
  return axes && *axes == std::vector<int64_t>{0} && start && *start == std::vector<int64_t>{0} && delta &&
         *delta == std::vector<int64_t>{1} && ElementIsDim(graph, shapes, range->input(1), 0, input_ids, 1);
}

// The Gathers at the leaves of the sum: on axis 0 of constant float tables of one width.
MatchResult<std::vector<Lookup>> MatchLookups(const Graph& graph, const std::vector<std::string>& leaves) {
  std::vector<Lookup> lookups;
  for (const std::string& leaf : leaves) {
    Node* gather = ProducerWithOp(graph, leaf, "Gather");
    if (gather == nullptr || gather->GetAttributeInt("axis", 0) != 0) return Fail();
    Lookup lookup;
    lookup.gather = gather;
    lookup.table = gather->input(0);
    lookup.ids = lookup.source = gather->input(1);
    if (Node* cast = ProducerWithOp(graph, lookup.ids, "Cast")) lookup.source = cast->input(0);
    const onnx::TensorProto* table = ConstantTensor(graph, lookup.table);
    if (table == nullptr || table->data_type() != onnx::TensorProto::FLOAT || table->dims_size() != 2) {
      return Fail("an embedding table is not a constant float matrix");
    }
    lookup.rows = table->dims(0);
    lookup.constant_row = SameConstantEverywhere(graph, lookup.ids);
    lookups.push_back(lookup);
  }
  for (const Lookup& lookup : lookups) {
    if (ConstantTensor(graph, lookup.table)->dims(1) != ConstantTensor(graph, lookups[0].table)->dims(1)) {
      return Fail("the embedding tables differ in width");
    }
  }
  return lookups;
}

// Words and token types are looked up with [B,S] graph inputs; the biggest table holds the words.
// Positions are the lookup whose ids are computed in the graph; a lookup of one constant row (beside
// two others) is folded into the word table. Where every lookup reads a graph input (GPT-2 exported with
// position_ids, a hand-written graph reading one ids input three times), the position ids are passed
// explicitly, and then which given lookup is which does not change the sum the kernel computes: the
// words are the biggest table, the token types one whose ids are shaped as the words' (the kernel's only
// rule for them), the positions the other.
MatchResult<Matched> AssignRoles(const Graph& graph, const ShapeInfo& shapes, EmbedMatch* match) {
  std::vector<int> given;  // lookups whose ids are graph inputs
  for (int i = 0; i < static_cast<int>(match->lookups.size()); ++i) {
    const Lookup& lookup = match->lookups[static_cast<size_t>(i)];
    if (lookup.constant_row && match->constant < 0 && match->lookups.size() == 3) {
      match->constant = i;
    } else if (!graph.IsGraphInput(lookup.source) || graph.Initializer(lookup.source) != nullptr) {
      if (match->position >= 0) return Fail("more than one lookup uses computed ids");
      match->position = i;
    } else {
      given.push_back(i);
    }
  }
  auto rows_of = [&](int i) { return match->lookups[static_cast<size_t>(i)].rows; };
  auto source = [&](int i) -> const std::string& { return match->lookups[static_cast<size_t>(i)].source; };
  if (given.empty()) return Fail("no word lookup from an input");
  match->word = given.front();
  for (int i : given) {
    if (rows_of(i) > rows_of(match->word)) match->word = i;
  }
  std::vector<int> others;
  for (int i : given) {
    if (i != match->word) others.push_back(i);
  }
  if (match->position < 0) {
    if (others.empty()) return Fail("no position lookup beside the word lookup");
    if (others.size() == 1) {
      match->position = others.front();
    } else {
      const bool first_is_type = shapes.SameShape(source(others[0]), source(match->word));
      match->type = first_is_type ? others[0] : others[1];
      match->position = first_is_type ? others[1] : others[0];
    }
  } else if (others.size() > 1) {
    return Fail("more than one token type lookup");
  } else if (others.size() == 1) {
    match->type = others.front();
  }
  if (match->constant < 0) return Matched{};
  const Lookup& constant = match->lookups[static_cast<size_t>(match->constant)];
  const int64_t row = *constant.constant_row < 0 ? *constant.constant_row + constant.rows : *constant.constant_row;
  auto words = TensorFloats(*ConstantTensor(graph, match->lookups[static_cast<size_t>(match->word)].table));
  auto rows = TensorFloats(*ConstantTensor(graph, constant.table));
  if (match->type >= 0 || row < 0 || row >= constant.rows || !words || !rows) {
    return Fail("a lookup of one constant row beside a token type input, or out of its table");
  }
  match->word_plus_row = *std::move(words);
  const size_t hidden = static_cast<size_t>(match->hidden);
  for (size_t i = 0; i < match->word_plus_row.size(); ++i) {
    match->word_plus_row[i] += (*rows)[static_cast<size_t>(row) * hidden + i % hidden];
  }
  return Matched{};
}

// Only the tree reads the lookups, but for Shape nodes reading one shaped like the sum (GPT-2's
// input_shape), which read the fused output instead; the sum itself may be read elsewhere (output 2).
MatchResult<Matched> CheckReaders(const Graph& graph, const ShapeInfo& shapes, EmbedMatch* match) {
  const std::string& normalized = match->norm->output(0);  // shaped as the sum
  for (const Lookup& lookup : match->lookups) {
    const std::string& looked_up = lookup.gather->output(0);
    if (graph.IsGraphOutput(looked_up)) return Fail("an embedding lookup is a graph output");
    int tree_readers = 0;
    for (Node* reader : graph.Consumers(looked_up)) {
      if (reader->op_type() == "Shape" && reader->domain().empty() && shapes.SameShape(looked_up, normalized)) {
        match->shape_readers.push_back(reader);
      } else {
        ++tree_readers;
      }
    }
    if (tree_readers != 1) return Fail("an embedding lookup is read elsewhere");
  }
  const size_t norm_reads = match->norm->op_type() == "LayerNormalization" ? 1 : 0;
  match->sum_read_elsewhere =
      !match->sum.empty() && (graph.Consumers(match->sum).size() > norm_reads || graph.IsGraphOutput(match->sum));
  return Matched{};
}

// The norm the sum feeds, and the sum's leaves: ONNX's LayerNormalization over the last axis, or ONNX
// Runtime's SkipLayerNormalization without a bias, its mean and inverse deviation unread (a graph its
// transformers optimizer wrote sums two of the lookups inside it: input + skip, the sum as output 3).
MatchResult<Matched> MatchNorm(const Graph& graph, Node* norm, EmbedMatch* match, std::vector<std::string>* leaves) {
  match->norm = norm;
  if (norm->op_type() == "LayerNormalization" && norm->domain().empty() && norm->input_size() >= 2 &&
      norm->output_size() == 1) {
    const int64_t axis = norm->GetAttributeInt("axis", -1);
    if (axis != -1 && axis != 2) return Fail();
    match->sum = norm->input(0);
    match->gamma = norm->input(1);
    match->beta = norm->input_size() > 2 ? norm->input(2) : "";
    match->epsilon = norm->GetAttributeFloat("epsilon", 1e-5f);
    CollectSum(graph, match->sum, 0, leaves, &match->adds);
    if (match->adds.empty()) return Fail();
    return Matched{};
  }
  if (norm->op_type() != "SkipLayerNormalization" || norm->domain() != "com.microsoft" || norm->input_size() < 3 ||
      norm->input_size() > 4) {
    return Fail();
  }
  for (int out = 1; out < std::min(norm->output_size(), 3); ++out) {
    const std::string& statistic = norm->output(out);
    if (!statistic.empty() && (!graph.Consumers(statistic).empty() || graph.IsGraphOutput(statistic))) {
      return Fail("the skip norm's mean or inverse deviation is read");
    }
  }
  match->sum = norm->output_size() > 3 ? norm->output(3) : "";
  match->gamma = norm->input(2);
  match->beta = norm->input_size() > 3 ? norm->input(3) : "";
  match->epsilon = norm->GetAttributeFloat("epsilon", 1e-12f);  // SkipLayerNormalization's default
  // Each side a lookup or an Add tree of them; the tree's root is read only by the norm.
  for (int side = 0; side < 2; ++side) CollectSum(graph, norm->input(side), 1, leaves, &match->adds);
  return Matched{};
}

// Anchored at the norm (MatchNorm).
MatchResult<EmbedMatch> MatchEmbedding(const Graph& graph, Node* norm, const ShapeInfo& shapes) {
  EmbedMatch match;
  std::vector<std::string> leaves;
  if (MatchResult<Matched> anchored = MatchNorm(graph, norm, &match, &leaves); !anchored) return anchored.failure();
  if (leaves.size() < 2 || leaves.size() > 3) return Fail();
  MatchResult<std::vector<Lookup>> lookups = MatchLookups(graph, leaves);
  if (!lookups) return lookups.failure();
  match.lookups = *std::move(lookups);
  match.hidden = ConstantTensor(graph, match.lookups[0].table)->dims(1);
  if (MatchResult<Matched> roles = AssignRoles(graph, shapes, &match); !roles) return roles.failure();
  const std::string& ids = match.lookups[static_cast<size_t>(match.word)].source;
  const Lookup& position = match.lookups[static_cast<size_t>(match.position)];
  if (shapes.Rank(ids) != 2 ||
      (match.type >= 0 && !shapes.SameShape(match.lookups[static_cast<size_t>(match.type)].source, ids))) {
    return Fail("the word and token type ids are not known to share one [B,S] shape");
  }
  match.counting = PositionsCountUp(graph, shapes, position.ids, ids);
  if (!match.counting && (shapes.Rank(position.ids) != 2 || !shapes.SameDim(position.ids, 1, ids, 1) ||
                          !(shapes.DimValue(position.ids, 0) == 1 || shapes.SameDim(position.ids, 0, ids, 0)))) {
    return Fail("the position ids are not 0..S-1 nor known to be [B,S] or [1,S]");
  }
  const onnx::TensorProto* gamma = ConstantTensor(graph, match.gamma);
  const onnx::TensorProto* beta = match.beta.empty() ? nullptr : ConstantTensor(graph, match.beta);
  if (gamma == nullptr || gamma->dims_size() != 1 || gamma->dims(0) != match.hidden ||
      (!match.beta.empty() && (beta == nullptr || beta->dims_size() != 1 || beta->dims(0) != match.hidden))) {
    return Fail("gamma and beta are not constants of the embedding width");
  }
  if (MatchResult<Matched> readers = CheckReaders(graph, shapes, &match); !readers) return readers.failure();
  return match;
}

void Rewrite(Graph& graph, const EmbedMatch& match, const ShapeInfo& shapes, PassContext& context) {
  Node* norm = match.norm;
  const Lookup& word = match.lookups[static_cast<size_t>(match.word)];
  const Lookup* type = match.type >= 0 ? &match.lookups[static_cast<size_t>(match.type)] : nullptr;
  const Lookup& position = match.lookups[static_cast<size_t>(match.position)];
  auto to_int32 = [&](const std::string& value) {
    if (shapes.ElementType(value) == onnx::TensorProto::INT32) return value;
    return AddCast(graph, value, onnx::TensorProto::INT32, norm);
  };
  std::string beta = match.beta;
  if (beta.empty()) {
    beta = graph.UniqueName("embed_layer_norm_beta");
    graph.AddInitializer(MakeFloatTensor(beta, {match.hidden}, std::vector<float>(static_cast<size_t>(match.hidden), 0.0f)));
  }
  const std::string name = graph.UniqueName("EmbedLayerNorm");
  std::vector<std::string> inputs = {to_int32(word.source), type != nullptr ? to_int32(type->source) : ""};
  if (match.constant >= 0) {
    const std::string folded =
        graph.UniqueName(word.table + "_plus_" + match.lookups[static_cast<size_t>(match.constant)].table);
    graph.AddInitializer(MakeFloatTensor(folded, {word.rows, match.hidden}, match.word_plus_row));
    inputs.push_back(folded);
  } else {
    inputs.push_back(word.table);
  }
  inputs.insert(inputs.end(), {position.table, type != nullptr ? type->table : "", match.gamma, beta,
                               ""});  // mask: Attention takes the raw mask itself
  if (!match.counting) inputs.push_back(to_int32(position.ids));
  // ONNX Runtime's type inference wants mask_index named even when nothing reads it.
  std::vector<std::string> outputs = {norm->output(0), graph.UniqueName(norm->output(0) + "_mask_index")};
  if (match.sum_read_elsewhere) outputs.push_back(match.sum);
  onnx::NodeProto fused = MakeNode("EmbedLayerNormalization", name, std::move(inputs),
                                   std::move(outputs), "com.microsoft");
  *fused.add_attribute() = MakeFloatAttribute("epsilon", match.epsilon);
  for (Node* reader : match.shape_readers) graph.SetInput(reader, 0, norm->output(0));
  graph.RemoveNode(norm);
  for (Node* add : match.adds) graph.RemoveNode(add);
  for (const Lookup& lookup : match.lookups) graph.RemoveNode(lookup.gather);
  graph.AddNode(std::move(fused), norm, /*after=*/true);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
}

class FuseEmbedLayerNormPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fuse_embed_layer_norm"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fuse word/position/token-type embedding lookups and their LayerNorm into EmbedLayerNormalization";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    RewriteEachMatch(
        graph, context, "fuse_embed_layer_norm: ", [&](Node* norm) { return MatchEmbedding(graph, norm, shapes); },
        [&](const EmbedMatch& match) { Rewrite(graph, match, shapes, context); });
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseEmbedLayerNormPass() { return std::make_unique<FuseEmbedLayerNormPass>(); }

}  // namespace onnxopt
