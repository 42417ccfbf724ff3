// fuse_embed_layer_norm: BERT-style embeddings (word + position [+ token type] lookups, summed, then
// LayerNorm) become ONNX Runtime's com.microsoft::EmbedLayerNormalization.
//
// Before:  e = Gather(word[V,H], ids) + Gather(type[T,H], type_ids) + Gather(pos[P,H], position_ids)
//          (any grouping and order of the Adds);  Y = LayerNormalization(e, gamma, beta)
// After:   Y = EmbedLayerNormalization(Cast(ids, int32), Cast(type_ids, int32), word, pos, type, gamma,
//                                      beta, , Cast(position_ids, int32), epsilon)
//          with e itself, where something else reads it (GPT-2's residual stream), as output 2.
// Without a token type lookup (GPT-2) segment ids and table are left out; a lookup whose ids all hold
// one constant (transformers 5's RoBERTa reads its all-zero token_type_ids buffer) adds one row
// everywhere, which goes into a copy of the word table. Position ids that provably
// count 0..S-1 (BERT's position_ids[:, :S] of an arange buffer, GPT-2's Range(0, S)) are left out,
// which is the kernel's default; others (RoBERTa's cumulative count) are passed as computed, [B,S]
// or [1,S].
// Checked: Gathers on axis 0 of constant float tables [*, H] with one H, the word and type ids graph
// inputs (optionally through a Cast) of one [B,S] shape, position ids [B,S] or [1,S] with that S,
// gamma/beta 1-D constants of H, normalization over the last axis, and the sum and the lookups read
// by nothing else (the sum may be, see above; a Shape of a lookup shaped like the sum reads Y instead).
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

// Leaves of an Add tree rooted at `value` (each Add read only inside the tree), with its Adds.
bool CollectSum(const Graph& graph, const std::string& value, int depth, std::vector<std::string>* leaves,
                std::vector<Node*>* adds) {
  Node* add = ProducerWithOp(graph, value, "Add");
  if (add == nullptr || depth > 3 || (depth > 0 && SoleConsumer(graph, value) == nullptr)) {
    leaves->push_back(value);
    return true;
  }
  adds->push_back(add);
  return CollectSum(graph, add->input(0), depth + 1, leaves, adds) &&
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
  if (Node* slice = ProducerWithOp(graph, ids, "Slice"); slice != nullptr && slice->input_size() >= 3) {
    const onnx::TensorProto* buffer = ConstantTensor(graph, slice->input(0));
    auto values = buffer != nullptr ? TensorInts(*buffer) : std::nullopt;
    auto starts = ConstantInts(graph, slice->input(1));
    auto axes = slice->input_size() > 3 && !slice->input(3).empty() ? ConstantInts(graph, slice->input(3))
                                                                     : std::optional<std::vector<int64_t>>();
    auto steps = slice->input_size() > 4 && !slice->input(4).empty() ? ConstantInts(graph, slice->input(4))
                                                                      : std::optional<std::vector<int64_t>>(std::vector<int64_t>{1});
    if (!values || buffer->dims_size() != 2 || buffer->dims(0) != 1 || !starts || *starts != std::vector<int64_t>{0} ||
        !axes || (*axes != std::vector<int64_t>{1} && *axes != std::vector<int64_t>{-1}) || !steps ||
        *steps != std::vector<int64_t>{1} || !ElementIsDim(graph, shapes, slice->input(2), 0, input_ids, 1)) {
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

class FuseEmbedLayerNormPass final : public Pass {
 public:
  absl::string_view name() const override { return "fuse_embed_layer_norm"; }
  bool keeps_value_types() const override { return true; }
  absl::string_view description() const override {
    return "Fuse word/position/token-type embedding lookups and their LayerNorm into EmbedLayerNormalization";
  }
  bool needs_shapes() const override { return true; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const ShapeInfo* shapes = context.shapes();
    if (shapes == nullptr) return absl::OkStatus();
    for (Node* norm : graph.Nodes()) {
      if (norm->removed() || norm->op_type() != "LayerNormalization" || !norm->domain().empty() ||
          norm->input_size() < 2 || norm->output_size() != 1) {
        continue;
      }
      std::string reason;
      if (!TryFuse(graph, norm, *shapes, context, &reason) && !reason.empty()) {
        context.Skip(absl::StrCat("fuse_embed_layer_norm: ", reason));
      }
    }
    return absl::OkStatus();
  }

 private:
  static bool TryFuse(Graph& graph, Node* norm, const ShapeInfo& shapes, PassContext& context, std::string* reason) {
    const int64_t axis = norm->GetAttributeInt("axis", -1);
    if (axis != -1 && axis != 2) return false;
    const std::string& sum = norm->input(0);
    std::vector<std::string> leaves;
    std::vector<Node*> adds;
    if (!CollectSum(graph, sum, 0, &leaves, &adds) || adds.empty() || leaves.size() < 2 || leaves.size() > 3) return false;
    std::vector<Lookup> lookups;
    for (const std::string& leaf : leaves) {
      Node* gather = ProducerWithOp(graph, leaf, "Gather");
      if (gather == nullptr || gather->GetAttributeInt("axis", 0) != 0) return false;
      Lookup lookup;
      lookup.gather = gather;
      lookup.table = gather->input(0);
      lookup.ids = lookup.source = gather->input(1);
      if (Node* cast = ProducerWithOp(graph, lookup.ids, "Cast")) lookup.source = cast->input(0);
      const onnx::TensorProto* table = ConstantTensor(graph, lookup.table);
      if (table == nullptr || table->data_type() != onnx::TensorProto::FLOAT || table->dims_size() != 2) {
        *reason = "an embedding table is not a constant float matrix";
        return false;
      }
      lookup.rows = table->dims(0);
      lookup.constant_row = SameConstantEverywhere(graph, lookup.ids);
      lookups.push_back(lookup);
    }
    const int64_t hidden = ConstantTensor(graph, lookups[0].table)->dims(1);
    for (const Lookup& lookup : lookups) {
      if (ConstantTensor(graph, lookup.table)->dims(1) != hidden) {
        *reason = "the embedding tables differ in width";
        return false;
      }
    }
    // Words and token types are looked up with [B,S] graph inputs; the biggest table holds the words.
    // Positions are the lookup whose ids are computed in the graph.
    Lookup* word = nullptr;
    Lookup* type = nullptr;
    Lookup* position = nullptr;
    Lookup* constant = nullptr;  // one row added everywhere: folded into the word table
    for (Lookup& lookup : lookups) {
      if (lookup.constant_row && constant == nullptr && lookups.size() == 3) {
        constant = &lookup;
      } else if (!graph.IsGraphInput(lookup.source) || graph.Initializer(lookup.source) != nullptr) {
        if (position != nullptr) {
          *reason = "more than one lookup uses computed ids";
          return false;
        }
        position = &lookup;
      } else if (word == nullptr || lookup.rows > word->rows) {
        if (word != nullptr) type = word;
        word = &lookup;
      } else {
        type = &lookup;
      }
    }
    if (word == nullptr || position == nullptr) {
      *reason = "no word lookup from an input and position lookup from computed ids";
      return false;
    }
    std::vector<float> word_plus_row;  // word table + the constant row, when there is one
    if (constant != nullptr) {
      const int64_t row = *constant->constant_row < 0 ? *constant->constant_row + constant->rows : *constant->constant_row;
      auto words = TensorFloats(*ConstantTensor(graph, word->table));
      auto rows = TensorFloats(*ConstantTensor(graph, constant->table));
      if (type != nullptr || row < 0 || row >= constant->rows || !words || !rows) {
        *reason = "a lookup of one constant row beside a token type input, or out of its table";
        return false;
      }
      word_plus_row = *words;
      for (size_t i = 0; i < word_plus_row.size(); ++i) {
        word_plus_row[i] += (*rows)[static_cast<size_t>(row * hidden) + i % static_cast<size_t>(hidden)];
      }
    }
    const std::string& ids = word->source;
    if (shapes.Rank(ids) != 2 || (type != nullptr && !shapes.SameShape(type->source, ids))) {
      *reason = "the word and token type ids are not known to share one [B,S] shape";
      return false;
    }
    const bool counting = PositionsCountUp(graph, shapes, position->ids, ids);
    if (!counting && (shapes.Rank(position->ids) != 2 || !shapes.SameDim(position->ids, 1, ids, 1) ||
                      !(shapes.DimValue(position->ids, 0) == 1 || shapes.SameDim(position->ids, 0, ids, 0)))) {
      *reason = "the position ids are not 0..S-1 nor known to be [B,S] or [1,S]";
      return false;
    }
    const onnx::TensorProto* gamma = ConstantTensor(graph, norm->input(1));
    const onnx::TensorProto* beta = norm->input_size() > 2 ? ConstantTensor(graph, norm->input(2)) : nullptr;
    if (gamma == nullptr || gamma->dims_size() != 1 || gamma->dims(0) != hidden ||
        (norm->input_size() > 2 && (beta == nullptr || beta->dims_size() != 1 || beta->dims(0) != hidden))) {
      *reason = "gamma and beta are not constants of the embedding width";
      return false;
    }
    // Only the tree reads the lookups, but for Shape nodes reading one shaped like the sum (GPT-2's
    // input_shape), which read the fused output instead; the sum itself may be read elsewhere (output 2).
    std::vector<Node*> shape_readers;
    for (const Lookup& lookup : lookups) {
      const std::string& looked_up = lookup.gather->output(0);
      if (graph.IsGraphOutput(looked_up)) {
        *reason = "an embedding lookup is a graph output";
        return false;
      }
      int tree_readers = 0;
      for (Node* reader : graph.Consumers(looked_up)) {
        if (reader->op_type() == "Shape" && reader->domain().empty() && shapes.SameShape(looked_up, sum)) {
          shape_readers.push_back(reader);
        } else {
          ++tree_readers;
        }
      }
      if (tree_readers != 1) {
        *reason = "an embedding lookup is read elsewhere";
        return false;
      }
    }
    const bool sum_read_elsewhere = graph.Consumers(sum).size() > 1 || graph.IsGraphOutput(sum);

    // Rewrite.
    auto to_int32 = [&](const std::string& value) {
      if (shapes.ElementType(value) == onnx::TensorProto::INT32) return value;
      return AddCast(graph, value, onnx::TensorProto::INT32, norm);
    };
    std::string beta_name = norm->input_size() > 2 ? norm->input(2) : "";
    if (beta_name.empty()) {
      beta_name = graph.UniqueName("embed_layer_norm_beta");
      graph.AddInitializer(MakeFloatTensor(beta_name, {hidden}, std::vector<float>(static_cast<size_t>(hidden), 0.0f)));
    }
    onnx::NodeProto fused;
    fused.set_op_type("EmbedLayerNormalization");
    fused.set_domain("com.microsoft");
    fused.set_name(graph.UniqueName("EmbedLayerNorm"));
    fused.add_input(to_int32(ids));
    fused.add_input(type != nullptr ? to_int32(type->source) : "");
    if (constant != nullptr) {
      const std::string folded = graph.UniqueName(word->table + "_plus_" + constant->table);
      graph.AddInitializer(MakeFloatTensor(folded, {word->rows, hidden}, word_plus_row));
      fused.add_input(folded);
    } else {
      fused.add_input(word->table);
    }
    fused.add_input(position->table);
    fused.add_input(type != nullptr ? type->table : "");
    fused.add_input(norm->input(1));
    fused.add_input(beta_name);
    fused.add_input("");  // mask: Attention takes the raw mask itself
    if (!counting) fused.add_input(to_int32(position->ids));
    fused.add_output(norm->output(0));
    // ONNX Runtime's type inference wants mask_index named even when nothing reads it.
    fused.add_output(graph.UniqueName(norm->output(0) + "_mask_index"));
    if (sum_read_elsewhere) fused.add_output(sum);
    *fused.add_attribute() = FloatAttribute("epsilon", norm->GetAttributeFloat("epsilon", 1e-5f));
    for (Node* reader : shape_readers) graph.SetInput(reader, 0, norm->output(0));
    graph.RemoveNode(norm);
    for (Node* add : adds) graph.RemoveNode(add);
    for (const Lookup& lookup : lookups) graph.RemoveNode(lookup.gather);
    graph.AddNode(std::move(fused), norm, /*after=*/true);
    context.RequireOpset("com.microsoft", 1);
    context.CountRewrite();
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseEmbedLayerNormPass() { return std::make_unique<FuseEmbedLayerNormPass>(); }

}  // namespace onnxopt
