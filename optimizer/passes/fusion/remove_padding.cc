// remove_padding: the token-wise blocks of a fused encoder run on the valid tokens only, in one of two
// forms. The gather form, for the CPU, whose Attention kernel takes padded batches only, does as ONNX
// Runtime's training-side PaddingElimination: the residual stream is packed to [tokens, hidden] by
// the mask's non-zero positions after the embedding; each Attention gets it scattered back to
// [batch, sequence, hidden] and its output is gathered again, so the output projection, the
// feed-forward block and both norms compute the valid tokens alone. The packed form, for CUDA, does
// as ONNX Runtime's convert_to_packing_mode: RemovePadding after the embedding, PackedAttention on the
// packed tokens (no scatter, no padded attention), RestorePadding after the last layer.
//
// Before:  x0 = EmbedLayerNormalization(ids, ..., mask) -> [B, S, H]; per layer
//            a = Attention(x, W, b, mask_index); h = SkipLN(MatMul(a, Wo), x); x' = SkipLN(FFN(h), h)
// After (gather): idx = NonZero(Reshape(mask, [-1])); p0 = Gather(Reshape(x0, [-1, H]), idx) -> [N, H];
//            per layer a = Attention(Reshape(ScatterND(0, idx, p), [B, S, H]), ...);
//            h = SkipLN(MatMul(Gather(a), Wo), p); ... and the last layer's output scattered back to
//            [B, S, H] under its old name.
// After (packed): p0, offsets, cumulative, _ = RemovePadding(x0, mask_index); per layer
//            a = PackedAttention(p, W, b, offsets, cumulative); h = SkipLN(MatMul(a, Wo), p); ...
//            and RestorePadding(last, offsets) under the last layer's output name.
// Values at padded positions become 0 instead of what the padded computation gave there, which no
// valid position reads (Attention masks padded keys); parity is judged on the valid positions when
// this pass ran. The packed form takes the first mask_index[b] tokens of row b, so it needs the
// Attention to read the embedding's mask index (lengths: the model itself reads its mask as right
// padding); else, and for causal or rotary Attention, the gather form runs. PackedAttention has CUDA
// kernels only: form "auto" packs where the job runs on CUDA.
// Measured, gather form (onnxopt-padding-benchmark, batch 8 x 128, 2 CPU threads): BERT-base size
// 1.55x with half the tokens padding, 1.16x with none; 2 layers of hidden 128 1.33x and 1.10x; but the
// 2-layer hidden-64 Hugging Face BERT fixture 0.92x at about a quarter padding, so it is not in a
// preset: a job asks for it, and its benchmark (with onRegression) tells.
// Checked: every layer's residual value read by exactly its Attention (input 0, the embedding's
// mask_index as mask, no past state) and its first SkipLayerNormalization (the skip); the Attention
// output read by one MatMul with a constant weight that feeds that norm; the feed-forward a chain of
// MatMul (constant weights), Add (constant bias) and the Gelu family ending in the second norm's
// input; no extra outputs of the norms read; float32.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

constexpr char kMicrosoft[] = "com.microsoft";

struct Layer {
  Node* attention = nullptr;
  Node* projection = nullptr;  // MatMul(attention, Wo)
  Node* first_norm = nullptr;  // SkipLN(projection, x)
  Node* second_norm = nullptr; // SkipLN(ffn, h)
};

bool IsContrib(const Node* node, const char* op) {
  return node != nullptr && node->op_type() == op && node->domain() == kMicrosoft;
}

bool ReadsOnlyFirstOutput(const Graph& graph, const Node& node) {
  for (int i = 1; i < node.output_size(); ++i) {
    if (!node.output(i).empty() && (graph.HasConsumers(node.output(i)) || graph.IsGraphOutput(node.output(i)))) {
      return false;
    }
  }
  return true;
}

bool ConstantWeight(const Graph& graph, const std::string& value, int rank) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  return tensor != nullptr && tensor->dims_size() == rank;
}

// A token-wise node of the feed-forward chain reading `value` as its first input.
bool TokenWise(const Graph& graph, const Node& node, const std::string& value) {
  if (node.input_size() < 1 || node.input(0) != value) return false;
  if (node.domain().empty()) {
    if (node.op_type() == "MatMul") return ConstantWeight(graph, node.input(1), 2);
    if (node.op_type() == "Add") return node.input_size() == 2 && ConstantWeight(graph, node.input(1), 1);
    return false;
  }
  static const std::set<std::string, std::less<>> kGelu = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu"};
  return node.domain() == kMicrosoft && kGelu.count(node.op_type()) > 0 &&
         (node.input_size() < 2 || node.input(1).empty() || ConstantWeight(graph, node.input(1), 1));
}

// The layer whose residual input is `x`, its Attention masked by `mask` (the first layer's when
// empty), or nothing.
std::optional<Layer> MatchLayer(const Graph& graph, const std::string& x, const std::string& mask) {
  if (graph.IsGraphOutput(x)) return std::nullopt;
  Layer layer;
  const std::vector<Node*> readers = graph.Consumers(x);
  if (readers.size() != 2) return std::nullopt;
  for (Node* reader : readers) {
    if (IsContrib(reader, "Attention") && reader->input(0) == x) layer.attention = reader;
    if (IsContrib(reader, "SkipLayerNormalization") && reader->input_size() >= 3 && reader->input(1) == x) {
      layer.first_norm = reader;
    }
  }
  Node* attention = layer.attention;
  if (attention == nullptr || layer.first_norm == nullptr || attention->input_size() < 4 ||
      attention->input(3).empty() || (!mask.empty() && attention->input(3) != mask) || attention->output_size() != 1 ||
      (attention->input_size() > 4 && !attention->input(4).empty())) {
    return std::nullopt;
  }
  layer.projection = SoleConsumer(graph, attention->output(0));
  if (layer.projection == nullptr || layer.projection->op_type() != "MatMul" || !layer.projection->domain().empty() ||
      layer.projection->input(0) != attention->output(0) || !ConstantWeight(graph, layer.projection->input(1), 2) ||
      layer.first_norm->input(0) != layer.projection->output(0) || !ReadsOnlyFirstOutput(graph, *layer.first_norm)) {
    return std::nullopt;
  }
  // h feeds the feed-forward chain and the second norm's skip.
  const std::string& h = layer.first_norm->output(0);
  if (graph.IsGraphOutput(h)) return std::nullopt;
  Node* chain = nullptr;
  for (Node* reader : graph.Consumers(h)) {
    if (IsContrib(reader, "SkipLayerNormalization") && reader->input_size() >= 3 && reader->input(1) == h) {
      layer.second_norm = reader;
    } else {
      chain = reader;
    }
  }
  if (layer.second_norm == nullptr || chain == nullptr || graph.Consumers(h).size() != 2 ||
      !ReadsOnlyFirstOutput(graph, *layer.second_norm)) {
    return std::nullopt;
  }
  std::string value = h;
  for (int steps = 0; steps < 8; ++steps) {
    if (!TokenWise(graph, *chain, value) || graph.IsGraphOutput(chain->output(0))) return std::nullopt;
    value = chain->output(0);
    if (value == layer.second_norm->input(0)) return graph.Consumers(value).size() == 1 ? std::optional<Layer>(layer) : std::nullopt;
    chain = SoleConsumer(graph, value);
    if (chain == nullptr) return std::nullopt;
  }
  return std::nullopt;
}

class RemovePaddingPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "remove_padding"; }
  absl::string_view description() const override {
    return "Run a fused encoder's token-wise blocks on the valid tokens only (packed by the attention mask); "
           "padded positions of its output become 0";
  }

  std::vector<ParamSpec> params() const override {
    return {{"form", ParamType::kString, "auto",
             "gather (NonZero, Gather and ScatterND around each Attention: any device), packed (RemovePadding, "
             "PackedAttention, RestorePadding: CUDA only) or auto (packed where the job runs on CUDA)"},
            {"right_padding", ParamType::kBool, "false",
             "the model's callers pad on the right, as tokenizers do for BERT-like encoders: the packed form may then "
             "count a raw [B, S] mask's ones as each row's tokens (without it, only the embedding's mask index)"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    const std::string& form = params.GetString("form");
    if (form != "auto" && form != "gather" && form != "packed") {
      return absl::InvalidArgumentError(absl::StrCat("form: '", form, "' is not auto, gather or packed"));
    }
    return absl::OkStatus();
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    const std::string& form = context.params().GetString("form");
    const bool packed = form == "packed" || (form == "auto" && context.hints().device == v1::DEVICE_CUDA);
    for (Node* embed : graph.Nodes()) {
      if (embed->removed() || !IsContrib(embed, "EmbedLayerNormalization")) continue;
      const std::string& x0 = embed->output(0);
      const std::optional<int64_t> hidden = shapes.DimValue(x0, -1);
      if (shapes.ElementType(x0) != onnx::TensorProto::FLOAT || shapes.Rank(x0) != 3 || !hidden) {
        context.Skip("remove_padding: the embedding output is not a float [B, S, H] of known H");
        continue;
      }
      std::vector<Layer> layers;
      std::string attention_mask;
      for (std::string x = x0;;) {
        std::optional<Layer> layer = MatchLayer(graph, x, attention_mask);
        if (!layer) break;
        attention_mask = layer->attention->input(3);
        layers.push_back(*layer);
        x = layer->second_norm->output(0);
      }
      if (layers.empty()) {
        context.Skip("remove_padding: no encoder layer of Attention, SkipLayerNormalization and a token-wise feed-forward");
        continue;
      }
      // The tokens to keep: a raw [B, S] mask as Attention reads it, or the embedding's own mask when
      // Attention reads the embedding's mask_index. That index holds lengths: the model itself reads
      // its mask as right padding, and for right padding the mask's non-zero positions are the same.
      std::string keep;
      if (shapes.Rank(attention_mask) == 2) {
        keep = attention_mask;
      } else if (embed->input_size() >= 8 && !embed->input(7).empty() && embed->output_size() >= 2 &&
                 attention_mask == embed->output(1)) {
        keep = embed->input(7);
      } else {
        context.Skip("remove_padding: the attention mask is neither a [B, S] mask nor the embedding's mask index");
        continue;
      }
      if (packed) {
        const bool right_padding = context.params().GetBool("right_padding");
        const std::string refused = PackedRefusal(*embed, attention_mask, shapes, right_padding, layers);
        if (refused.empty()) {
          const std::string counts = attention_mask == embed->output(1)
                                         ? attention_mask
                                         : TokenCounts(graph, attention_mask, *embed, context.OpsetVersion(""));
          RewritePacked(graph, *embed, counts, layers);
          context.Count("packed_layers", static_cast<int64_t>(layers.size()));
          context.CountRewrite(static_cast<int64_t>(layers.size()));
          continue;
        }
        context.Note(absl::StrCat(embed->name(), "\tpacked form refused: ", refused, "; the gather form runs"));
      }
      Rewrite(graph, *embed, keep, layers, *hidden);
      context.CountRewrite(static_cast<int64_t>(layers.size()));
    }
    return absl::OkStatus();
  }

 private:
  // The last layer's output, read by the rest of the model as [B, S, H], keeps its name for the
  // value restored to that shape: the layer writes a new (packed) name. Both names.
  static std::pair<std::string, std::string> RenameLastOutput(Graph& graph, const std::vector<Layer>& layers) {
    Node* last = layers.back().second_norm;
    const std::string output = last->output(0);
    const std::string packed_output = graph.UniqueName(output + "_packed");
    graph.SetOutput(last, 0, packed_output);
    return {packed_output, output};
  }

  // Why the packed form cannot run these layers ("" when it can).
  static std::string PackedRefusal(const Node& embed, const std::string& attention_mask, const ShapeInfo& shapes,
                                   bool right_padding, const std::vector<Layer>& layers) {
    const bool mask_index = embed.output_size() >= 2 && attention_mask == embed.output(1);
    if (!mask_index && !(right_padding && shapes.Rank(attention_mask) == 2)) {
      return "Attention reads a raw mask and packing takes each row's first tokens (set right_padding where callers "
             "pad on the right)";
    }
    for (const Layer& layer : layers) {
      const Node& attention = *layer.attention;
      if (attention.input(2).empty()) return absl::StrCat(attention.name(), " has no bias");
      if (attention.GetAttributeInt("unidirectional", 0) != 0) return absl::StrCat(attention.name(), " is causal");
      if (attention.GetAttributeInt("do_rotary", 0) != 0) return absl::StrCat(attention.name(), " is rotary");
    }
    return "";
  }

  // Each row's token count [B] int32 from a right-padded [B, S] mask: ReduceSum(Cast(mask), 1).
  static std::string TokenCounts(Graph& graph, const std::string& mask, const Node& embed, int64_t opset) {
    const std::string as_int = graph.UniqueName("padding_mask_int32");
    onnx::NodeProto cast = MakeNode("Cast", graph.UniqueName("padding_mask_cast"), {mask}, {as_int});
    *cast.add_attribute() = MakeIntAttribute("to", onnx::TensorProto::INT32);
    const std::string counts = graph.UniqueName("padding_token_counts");
    onnx::NodeProto sum = MakeNode("ReduceSum", graph.UniqueName("padding_count_tokens"), {as_int}, {counts});
    if (opset >= 13) {
      const std::string axis = graph.UniqueName("padding_sequence_axis");
      graph.AddInitializer(MakeInt64Tensor(axis, {1}));
      sum.add_input(axis);
    } else {
      *sum.add_attribute() = MakeIntsAttribute("axes", {1});
    }
    *sum.add_attribute() = MakeIntAttribute("keepdims", 0);
    graph.AddNode(std::move(sum), &embed, true);
    graph.AddNode(std::move(cast), &embed, true);
    return counts;
  }

  static void RewritePacked(Graph& graph, const Node& embed, const std::string& token_counts,
                            const std::vector<Layer>& layers) {
    const std::string packed_embedding = graph.UniqueName("padding_packed_embedding");
    const std::string offsets = graph.UniqueName("padding_token_offset");
    const std::string cumulative = graph.UniqueName("padding_cumulative_lengths");
    const std::string longest = graph.UniqueName("padding_max_length");
    // After the counts' producer: the embedding, or the ReduceSum after it.
    const Node* counted = graph.Producer(token_counts);
    graph.AddNode(MakeNode("RemovePadding", graph.UniqueName("padding_remove"), {embed.output(0), token_counts},
                           {packed_embedding, offsets, cumulative, longest}, kMicrosoft),
                  counted != nullptr ? counted : &embed, true);
    std::string packed = packed_embedding;
    for (const Layer& layer : layers) {
      Node* attention = layer.attention;
      std::vector<std::string> inputs = {packed, attention->input(1), attention->input(2), offsets, cumulative};
      if (attention->input_size() > 5 && !attention->input(5).empty()) inputs.push_back(attention->input(5));
      onnx::NodeProto fused = MakeNode("PackedAttention", graph.UniqueName(attention->name() + "_packed"),
                                       std::move(inputs), {attention->output(0)}, kMicrosoft);
      for (const auto& attribute : attention->proto().attribute()) {
        if (attribute.name() == "num_heads" || attribute.name() == "qkv_hidden_sizes" || attribute.name() == "scale") {
          *fused.add_attribute() = attribute;
        }
      }
      graph.RemoveNode(attention);
      graph.AddNode(std::move(fused), layer.projection, false);
      graph.SetInput(layer.first_norm, 1, packed);
      packed = layer.second_norm->output(0);
    }
    const auto [packed_output, output] = RenameLastOutput(graph, layers);
    graph.AddNode(MakeNode("RestorePadding", graph.UniqueName(output + "_restore"), {packed_output, offsets}, {output},
                           kMicrosoft),
                  layers.back().second_norm, true);
  }

  static void Rewrite(Graph& graph, const Node& embed, const std::string& mask, const std::vector<Layer>& layers,
                      int64_t hidden) {
    auto constant = [&](const std::string& hint, const std::vector<int64_t>& values) {
      const std::string name = graph.UniqueName(hint);
      graph.AddInitializer(MakeInt64Tensor(name, values));
      return name;
    };
    auto add = [&](const std::string& op, std::vector<std::string> inputs, const std::string& hint, const Node* anchor,
                   bool after) {
      const std::string out = graph.UniqueName(hint);
      graph.AddNode(MakeNode(op, out, std::move(inputs), {out}), anchor, after);
      return out;
    };
    const std::string flat = constant("padding_flat_shape", {-1});
    const std::string flat_hidden = constant("padding_flat_hidden_shape", {-1, hidden});
    const std::string column = constant("padding_index_column_shape", {-1, 1});
    const std::string x0 = embed.output(0);
    const std::string mask_flat = add("Reshape", {mask, flat}, "padding_mask_flat", &embed, true);
    const std::string nonzero = add("NonZero", {mask_flat}, "padding_nonzero", &embed, true);
    const std::string index = add("Reshape", {nonzero, flat}, "padding_token_index", &embed, true);
    const std::string index_2d = add("Reshape", {nonzero, column}, "padding_token_index_2d", &embed, true);
    const std::string padded_shape = add("Shape", {x0}, "padding_hidden_shape", &embed, true);
    const std::string x0_flat = add("Reshape", {x0, flat_hidden}, "padding_embedding_flat", &embed, true);
    const std::string flat_dims = add("Shape", {x0_flat}, "padding_flat_dims", &embed, true);
    const std::string zeros = add("ConstantOfShape", {flat_dims}, "padding_zeros", &embed, true);
    auto gather = [&](const std::string& value, const std::string& hint, const Node* anchor) {
      const std::string value_flat = add("Reshape", {value, flat_hidden}, hint + "_flat", anchor, true);
      return add("Gather", {value_flat, index}, hint, anchor, true);  // axis 0: the default
    };
    auto scatter = [&](const std::string& packed, const std::string& hint, const Node* anchor, bool after) {
      const std::string flat_value = add("ScatterND", {zeros, index_2d, packed}, hint + "_flat", anchor, after);
      return add("Reshape", {flat_value, padded_shape}, hint, anchor, after);
    };
    std::string packed = gather(x0, "padding_packed_embedding", &embed);
    for (const Layer& layer : layers) {
      const std::string padded = scatter(packed, layer.attention->name() + "_padded_input", layer.attention, false);
      graph.SetInput(layer.attention, 0, padded);
      graph.SetInput(layer.projection, 0, gather(layer.attention->output(0), layer.attention->name() + "_packed", layer.attention));
      graph.SetInput(layer.first_norm, 1, packed);
      packed = layer.second_norm->output(0);
    }
    const auto [packed_output, output] = RenameLastOutput(graph, layers);
    const Node* last = layers.back().second_norm;
    const std::string flat_output = graph.UniqueName(output + "_flat");
    graph.AddNode(MakeNode("ScatterND", flat_output, {zeros, index_2d, packed_output}, {flat_output}), last, true);
    graph.AddNode(MakeNode("Reshape", graph.UniqueName(output + "_unpacked"), {flat_output, padded_shape}, {output}), last,
                  true);
  }
};

}  // namespace

std::unique_ptr<Pass> MakeRemovePaddingPass() { return std::make_unique<RemovePaddingPass>(); }

}  // namespace onnxopt
