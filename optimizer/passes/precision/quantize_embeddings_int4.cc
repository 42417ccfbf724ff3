// quantize_embeddings_int4: a decoder's token table to 4-bit blocks, dequantized per looked-up row by
// ONNX Runtime's GatherBlockQuantized. Beside int4 projections the float32 table is most of the file
// (Qwen2-0.5B's shape: 151936 x 896, 544 MB of an 854 MB int4 model), and only the rows the ids select
// are ever read; llama.cpp's Q4_0 files store it in 4 bits too.
//
// Before:  y = Gather(table:f32[V, H], ids)                          (axis 0)
// After:   y = GatherBlockQuantized(packed:u8[V, H/2], ids, scales:f32[V, H/block])
//              (bits 4, gather_axis 0, quantize_axis 1, symmetric: the zero point 8 implied)
// Blocks run along a row as MatMulNBits' run along K (the same packing, the first level in the low
// nibble), rounded to nearest from the block's largest magnitude. Only when every reader of the table
// is such a Gather (a table tied to an output projection would otherwise be stored twice) and H is a
// multiple of the block (the operator takes a row's bytes as H / 2).
#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/precision/weight_blocks.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

class QuantizeEmbeddingsInt4Pass final : public Pass {
 public:
  absl::string_view name() const override { return "quantize_embeddings_int4"; }
  absl::string_view description() const override {
    return "Gather on a constant float table reads 4-bit blocks and dequantizes the looked-up rows "
           "(GatherBlockQuantized)";
  }
  std::vector<ParamSpec> params() const override {
    return {{"block_size", ParamType::kInt, "32", "values per block along a row: 16..256, a power of two"},
            {"node_block_list", ParamType::kString, "", "comma-separated Gather nodes to leave in float"},
            {"min_elements", ParamType::kInt, "4096", "tables with fewer elements stay float"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    const int64_t block = params.GetInt("block_size");
    if (block < 16 || block > 256 || (block & (block - 1)) != 0) {
      return absl::InvalidArgumentError("quantize_embeddings_int4: block_size must be 16..256 and a power of two");
    }
    return absl::OkStatus();
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    const std::set<std::string> blocked = SplitNameList(context.params().GetString("node_block_list"));
    std::set<std::string> tables;
    for (const Node* node : graph.Nodes()) {
      if (node->op_type() == "Gather" && node->domain().empty() && ConstantTensor(graph, node->input(0)) != nullptr) {
        tables.insert(node->input(0));
      }
    }
    for (const std::string& table : tables) Rewrite(graph, context, table, blocked);
    return absl::OkStatus();
  }

 private:
  static void Rewrite(Graph& graph, PassContext& context, const std::string& table_name,
                      const std::set<std::string>& blocked) {
    const onnx::TensorProto* tensor = ConstantTensor(graph, table_name);
    if (tensor == nullptr || tensor->data_type() != onnx::TensorProto::FLOAT || tensor->dims_size() != 2) return;
    const int64_t rows = tensor->dims(0), width = tensor->dims(1);
    if (rows * width < context.params().GetInt("min_elements")) {
      context.Skip("Gather table left in float: smaller than min_elements");
      return;
    }
    BlockQuantization how;
    how.block = context.params().GetInt("block_size");
    if (width % how.block != 0) {
      context.Skip("Gather table left in float: its rows are not a multiple of the block");
      return;
    }
    std::optional<std::vector<Node*>> lookups = RowLookups(graph, table_name, blocked);
    if (!lookups) {
      context.Skip("Gather table left in float: the table is read by more than row lookups");
      return;
    }
    const std::vector<Node*>& readers = *lookups;
    // The table [V, H] is MatMulNBits' B transposed: V output columns of H values each.
    std::optional<FloatWeight> weight = ReadProductWeight(*tensor, /*transposed=*/true);
    std::optional<BlockQuantized> quantized = weight ? QuantizeBlocks(*weight, how) : std::nullopt;
    if (!quantized) {
      context.Skip("Gather table left in float: not finite");
      return;
    }
    const int64_t float_bytes = rows * width * static_cast<int64_t>(sizeof(float));
    const std::string base = graph.UniqueName(absl::StrCat(table_name, "_int4"));
    onnx::TensorProto packed =
        MakeRawTensor(base + "_packed", onnx::TensorProto::UINT8, {rows, width / 2}, std::move(quantized->packed));
    onnx::TensorProto scales = MakeFloatTensor(base + "_scales", {rows, quantized->blocks}, quantized->scales);
    const int64_t bytes_after = static_cast<int64_t>(packed.raw_data().size() + scales.raw_data().size());
    for (Node* reader : readers) {
      onnx::NodeProto gather =
          MakeNode("GatherBlockQuantized", graph.UniqueName(absl::StrCat(NodeKey(*reader), "_int4")),
                   {packed.name(), reader->input(1), scales.name()}, {reader->output(0)}, "com.microsoft");
      *gather.add_attribute() = MakeIntAttribute("bits", 4);
      *gather.add_attribute() = MakeIntAttribute("block_size", how.block);
      *gather.add_attribute() = MakeIntAttribute("gather_axis", 0);
      *gather.add_attribute() = MakeIntAttribute("quantize_axis", 1);
      graph.AddNode(std::move(gather), reader, /*after=*/false);
      graph.RemoveNode(reader);
    }
    graph.AddInitializer(std::move(packed));
    graph.AddInitializer(std::move(scales));
    context.RequireOpset("com.microsoft", 1);
    context.CountRewrite();
    context.Count("quantized_weights");
    context.Count("weight_bytes_before", float_bytes);
    context.Count("weight_bytes_after", bytes_after);
    context.Note(absl::StrCat(table_name, ": [", rows, ", ", width, "] in 4-bit blocks of ", how.block));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeQuantizeEmbeddingsInt4Pass() { return std::make_unique<QuantizeEmbeddingsInt4Pass>(); }

}  // namespace onnxopt
