// quantize_embeddings_int8: embedding tables to int8, dequantized per looked-up row. In an encoder
// the word embedding table is the largest single weight (BERT-base: 30522 x 768, a fifth of the
// model), and only the rows the input ids select are ever read, so dequantizing after the lookup
// costs a few thousand multiplies per token.
//
// Fused form (ONNX Runtime's QEmbedLayerNormalization, CPU):
//   Before:  out, mask_index = EmbedLayerNormalization(ids, segment_ids, word:f32, position:f32,
//                                                      segment:f32, gamma:f32, beta:f32, mask)
//   After:   out, mask_index = QEmbedLayerNormalization(ids, segment_ids, word:i8, position:i8,
//                                                       segment:i8, gamma:i8, beta:i8, mask,
//                                                       5 scales, 5 zero points)
//   Only without position_ids and without a read embedding_sum output, which the quantized operator
//   does not have; positions are then 0..S-1, as they are for the float operator.
// Plain form:
//   Before:  y = Gather(table:f32[V,H], ids)
//   After:   y = DequantizeLinear(Gather(table:i8[V,H], ids), scale, zero_point)
//   Only when every reader of the table is such a Gather (a table tied to an output projection
//   would otherwise be stored twice).
//
// Each tensor is quantized per tensor, asymmetrically over its own range widened to hold 0 (ONNX
// Runtime's operator takes one scale and zero point per tensor): scale = (max - min) / 255,
// zero_point = round(-128 - min / scale), which then lies in [-128, 127].
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

struct QuantizedTable {
  onnx::TensorProto values;      // INT8, the original dims
  onnx::TensorProto scale;       // FLOAT scalar
  onnx::TensorProto zero_point;  // INT8 scalar
  int64_t float_bytes = 0;
};

std::optional<QuantizedTable> QuantizeTable(Graph& graph, const std::string& value) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  if (tensor == nullptr || tensor->data_type() != onnx::TensorProto::FLOAT) return std::nullopt;
  std::optional<std::vector<float>> floats = TensorFloats(*tensor);
  if (!floats || floats->empty()) return std::nullopt;
  // The range holds 0, so that the zero point stays inside int8 (an all-positive gamma would otherwise
  // need one below -128 and be clipped).
  float low = 0, high = 0;
  for (float x : *floats) {
    if (!std::isfinite(x)) return std::nullopt;
    low = std::min(low, x);
    high = std::max(high, x);
  }
  float scale = (high - low) / 255.0f;
  if (!(scale > 0)) scale = 1.0f;  // all zeros
  const float zero_point = std::clamp(std::nearbyint(-128.0f - low / scale), -128.0f, 127.0f);
  std::string raw(floats->size(), '\0');
  for (size_t i = 0; i < floats->size(); ++i) {
    const float q = std::clamp(std::nearbyint((*floats)[i] / scale + zero_point), -128.0f, 127.0f);
    raw[i] = static_cast<char>(static_cast<int8_t>(q));
  }
  const std::string base = graph.UniqueName(absl::StrCat(value, "_int8"));
  QuantizedTable table;
  std::vector<int64_t> dims(tensor->dims().begin(), tensor->dims().end());
  table.values = MakeRawTensor(base, onnx::TensorProto::INT8, dims, std::move(raw));
  table.scale = MakeFloatTensor(absl::StrCat(base, "_scale"), {}, {scale});
  table.zero_point = MakeRawTensor(absl::StrCat(base, "_zero_point"), onnx::TensorProto::INT8, {},
                                   std::string(1, static_cast<char>(static_cast<int8_t>(zero_point))));
  table.float_bytes = static_cast<int64_t>(floats->size() * sizeof(float));
  return table;
}

bool IsRead(const Graph& graph, const Node& node, int output) {
  return output < node.output_size() && !node.output(output).empty() &&
         (graph.HasConsumers(node.output(output)) || graph.IsGraphOutput(node.output(output)));
}

class QuantizeEmbeddingsInt8Pass final : public Pass {
 public:
  absl::string_view name() const override { return "quantize_embeddings_int8"; }
  absl::string_view description() const override {
    return "Quantize embedding tables to int8 (per tensor): EmbedLayerNormalization becomes ONNX Runtime's "
           "QEmbedLayerNormalization, Gather on a constant table reads int8 rows and dequantizes them";
  }
  std::vector<ParamSpec> params() const override {
    return {{"op_types", ParamType::kString, "EmbedLayerNormalization,Gather", "comma-separated forms to quantize"},
            {"node_block_list", ParamType::kString, "", "comma-separated node names left in float"},
            {"min_elements", ParamType::kInt, "4096", "tables with fewer elements stay float"}};
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const std::set<std::string> blocked = SplitNameList(context.params().GetString("node_block_list"));
    const int64_t min_elements = context.params().GetInt("min_elements");
    const std::set<std::string> forms = SplitNameList(context.params().GetString("op_types"));
    std::set<std::string> gather_tables;
    for (Node* node : graph.Nodes()) {
      if (forms.count(std::string(node->op_type())) == 0) continue;
      if (blocked.count(NodeKey(*node)) > 0) {
        context.Skip("left in float: node block list");
        continue;
      }
      if (node->op_type() == "EmbedLayerNormalization" && node->domain() == "com.microsoft") {
        RewriteEmbedLayerNorm(graph, context, node);
      } else if (node->op_type() == "Gather" && node->domain().empty()) {
        gather_tables.insert(node->input(0));
      }
    }
    for (const std::string& table : gather_tables) RewriteGathers(graph, context, table, blocked, min_elements);
    return absl::OkStatus();
  }

 private:
  static void RewriteEmbedLayerNorm(Graph& graph, PassContext& context, Node* node) {
    if (node->input_size() > 8 && !node->input(8).empty()) {
      context.Skip("EmbedLayerNormalization left in float: position_ids (QEmbedLayerNormalization has none)");
      return;
    }
    if (IsRead(graph, *node, 2)) {
      context.Skip("EmbedLayerNormalization left in float: embedding_sum is read");
      return;
    }
    if (node->GetAttributeInt("mask_index_type", 1) != 1) {
      context.Skip("EmbedLayerNormalization left in float: mask_index_type is not 1");
      return;
    }
    const bool has_segment = node->input_size() > 4 && !node->input(1).empty() && !node->input(4).empty();
    std::vector<std::optional<QuantizedTable>> tables;
    for (int input : {2, 3, 4, 5, 6}) {
      if (input == 4 && !has_segment) {
        tables.emplace_back();
        continue;
      }
      tables.push_back(QuantizeTable(graph, node->input(input)));
      if (!tables.back()) {
        context.Skip("EmbedLayerNormalization left in float: a table or gamma/beta is not a finite float constant");
        return;
      }
    }
    onnx::NodeProto quantized =
        MakeNode("QEmbedLayerNormalization", graph.UniqueName(absl::StrCat(NodeKey(*node), "_int8")), {node->input(0)},
                 {}, "com.microsoft");
    quantized.add_input(has_segment ? node->input(1) : "");
    for (const auto& table : tables) quantized.add_input(table ? table->values.name() : "");
    quantized.add_input(node->input_size() > 7 ? node->input(7) : "");
    for (const auto& table : tables) quantized.add_input(table ? table->scale.name() : "");
    for (const auto& table : tables) quantized.add_input(table ? table->zero_point.name() : "");
    for (int output = 0; output < 2 && output < node->output_size(); ++output) quantized.add_output(node->output(output));
    if (const onnx::AttributeProto* epsilon = node->FindAttribute("epsilon")) *quantized.add_attribute() = *epsilon;

    int64_t before = 0, after = 0;
    for (auto& table : tables) {
      if (!table) continue;
      before += table->float_bytes;
      after += table->values.raw_data().size() + sizeof(float) + 1;
      graph.AddInitializer(std::move(table->values));
      graph.AddInitializer(std::move(table->scale));
      graph.AddInitializer(std::move(table->zero_point));
    }
    graph.AddNode(std::move(quantized), node, /*after=*/false);
    graph.RemoveNode(node);
    context.RequireOpset("com.microsoft", 1);
    context.CountRewrite();
    context.Count("quantized_weights", has_segment ? 5 : 4);
    context.Count("weight_bytes_before", before);
    context.Count("weight_bytes_after", after);
  }

  static void RewriteGathers(Graph& graph, PassContext& context, const std::string& table_name,
                             const std::set<std::string>& blocked, int64_t min_elements) {
    const onnx::TensorProto* tensor = ConstantTensor(graph, table_name);
    if (tensor == nullptr || tensor->data_type() != onnx::TensorProto::FLOAT || tensor->dims_size() != 2) return;
    if (tensor->dims(0) * tensor->dims(1) < min_elements) {
      context.Skip("Gather table left in float: smaller than min_elements");
      return;
    }
    if (context.OpsetVersion("") < 10) {
      context.Skip("Gather table left in float: DequantizeLinear needs opset 10");
      return;
    }
    std::optional<std::vector<Node*>> lookups = RowLookups(graph, table_name, blocked);
    if (!lookups) {
      context.Skip("Gather table left in float: the table is read by more than row lookups");
      return;
    }
    const std::vector<Node*>& readers = *lookups;
    std::optional<QuantizedTable> table = QuantizeTable(graph, table_name);
    if (!table) {
      context.Skip("Gather table left in float: not finite");
      return;
    }
    for (Node* reader : readers) {
      const std::string rows = graph.UniqueName(absl::StrCat(reader->output(0), "_int8"));
      onnx::NodeProto gather = reader->proto();
      gather.set_output(0, rows);
      gather.set_input(0, table->values.name());
      onnx::NodeProto dequantize =
          MakeNode("DequantizeLinear", graph.UniqueName(absl::StrCat(NodeKey(*reader), "_dequantize")),
                   {rows, table->scale.name(), table->zero_point.name()}, {reader->output(0)});
      graph.AddNode(std::move(gather), reader, /*after=*/false);
      graph.AddNode(std::move(dequantize), reader, /*after=*/false);
      graph.RemoveNode(reader);
    }
    context.CountRewrite();
    context.Count("quantized_weights");
    context.Count("weight_bytes_before", table->float_bytes);
    context.Count("weight_bytes_after", static_cast<int64_t>(table->values.raw_data().size() + sizeof(float) + 1));
    graph.AddInitializer(std::move(table->values));
    graph.AddInitializer(std::move(table->scale));
    graph.AddInitializer(std::move(table->zero_point));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeQuantizeEmbeddingsInt8Pass() { return std::make_unique<QuantizeEmbeddingsInt8Pass>(); }

}  // namespace onnxopt
