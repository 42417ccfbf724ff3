// fuse_rotary_embedding: rotary position embeddings, as exporters write them on attention heads,
// become ONNX Runtime's com.microsoft::RotaryEmbedding.
//
// Before:  y = x * Unsqueeze(cos, 1) + Concat(-x[..., h:], x[..., :h]) * Unsqueeze(sin, 1)
//          x [B,N,S,D] (D = 2h); cos/sin [B',S,D] (B' = 1 or B) tables computed as
//          op(Concat(f, f)) [* scale] from the positions' frequencies f (Hugging Face's rotary classes)
// After:   y = RotaryEmbedding(x, position_ids, cos_cache, sin_cache)   (4-D input, not interleaved)
//          cos_cache = Reshape(Slice(cos, 0, h, axis -1), [-1, h]): the first halves as rows [B'*S, h];
// Interleaved (GPT-J): y = x * cos + rotate_every_two(x) * sin with tables that repeat each value twice
//          in a row (duplicate_interleave) -> RotaryEmbedding(..., interleaved=1), the caches the tables'
//          even elements, Slice(cos, 0, end, axis -1, step 2), as rows.
//          position_ids = 0 (an offset) where B' is known to be 1, else the row of (b, s): b*S + s
//          Tables stored in the model (cos_cached[:S][position_ids], transformers before 4.38): the
//          first halves of the stored table as the caches, position_ids the Gather's ids.
// The caches and position ids are built once per table pair and shared by every layer. A rotation
// whose tables are not such duplicated halves stays element-wise (the attention fusion still takes
// it: emit_multi_head_attention.cc). This is the first layer of the attention fusion: fuse_attention
// reads RotaryEmbedding(Transpose(Reshape(x Wq))) as rotated Q and K (rotary.h).
#include <map>

#include "optimizer/passes/fusion/rotary.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// The rotation's tables where both are stored ones that RotaryEmbedding can read at their ids.
std::optional<StoredTables> ReadableStoredTables(const Rotation& rotation, const ShapeInfo& shapes,
                                                 const std::optional<StoredTable>& cos,
                                                 const std::optional<StoredTable>& sin) {
  if (!cos || !sin || cos->ids != sin->ids || cos->table->dims(1) != 2 * rotation.half ||
      shapes.ElementType(cos->ids) != onnx::TensorProto::INT64 ||
      // RotaryEmbedding takes position ids [B, S] of the heads' own B and S.
      shapes.Rank(cos->ids) != 2 || !shapes.SameDim(cos->ids, 0, rotation.heads, 0) ||
      !shapes.SameDim(cos->ids, 1, rotation.heads, 2)) {
    return std::nullopt;
  }
  return StoredTables{*cos, *sin};
}

class FuseRotaryEmbeddingPass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "fuse_rotary_embedding"; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kKeepsValueTypes; }
  absl::string_view description() const override {
    return "Fuse rotary position embeddings (x * cos + rotate_half(x) * sin on attention heads, or interleaved "
           "rotate_every_two) into ONNX Runtime's RotaryEmbedding";
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    if (context.OpsetVersion("") < 11) return absl::OkStatus();  // the caches' Slice and Range
    std::map<std::string, RotaryInputs> caches;
    // Stored tables are read (every element compared) once per table, not once per layer.
    std::map<std::string, std::optional<StoredTable>> stored_tables;
    auto stored_table = [&](const std::string& value) -> const std::optional<StoredTable>& {
      auto it = stored_tables.find(value);
      if (it == stored_tables.end()) it = stored_tables.emplace(value, MatchStoredTable(graph, value)).first;
      return it->second;
    };
    for (Node* add : graph.Nodes()) {
      if (add->removed() || add->op_type() != "Add" || !add->domain().empty()) continue;
      MatchResult<Rotation> rotation = MatchRotation(graph, shapes, add->output(0));
      if (!rotation || rotation->fused != nullptr) continue;
      if (shapes.Rank(rotation->heads) != 4 || shapes.DimValue(rotation->heads, 3) != 2 * rotation->half) {
        context.Skip("fuse_rotary_embedding: the rotated heads are not known to be [B,N,S,D] with D twice the half");
        continue;
      }
      if (rotation->interleaved) {
        if (!IsDuplicatedPairTable(graph, shapes, rotation->cos) || !IsDuplicatedPairTable(graph, shapes, rotation->sin)) {
          context.Skip("fuse_rotary_embedding: the cos/sin tables of an interleaved rotation do not repeat each value "
                       "twice in a row (left element-wise)");
          continue;
        }
      }
      const std::optional<StoredTables> stored =
          rotation->interleaved
              ? std::nullopt
              : ReadableStoredTables(*rotation, shapes, stored_table(rotation->cos), stored_table(rotation->sin));
      if (!rotation->interleaved && !stored &&
          (!IsDuplicatedHalfTable(graph, shapes, rotation->cos, "Cos") ||
           !IsDuplicatedHalfTable(graph, shapes, rotation->sin, "Sin"))) {
        context.Skip("fuse_rotary_embedding: the cos/sin tables are not duplicated halves (left element-wise)");
        continue;
      }
      const std::string output = add->output(0);
      if (!OnlyPatternReads(graph, rotation->nodes, output)) {
        context.Skip("fuse_rotary_embedding: a value inside the rotation is read elsewhere");
        continue;
      }
      for (Node* node : rotation->nodes) graph.RemoveNode(node);
      const Node* at = add;
      const RotaryInputs& inputs = RotaryInputsFor(graph, shapes, *rotation, stored, &caches, &at);
      onnx::NodeProto fused = MakeNode("RotaryEmbedding", graph.UniqueName("RotaryEmbedding"),
                                       {rotation->heads, inputs.position_ids, inputs.cos_cache, inputs.sin_cache},
                                       {output}, "com.microsoft");
      if (rotation->interleaved) *fused.add_attribute() = MakeIntAttribute("interleaved", 1);
      graph.AddNode(std::move(fused), at, /*after=*/true);
      context.RequireOpset("com.microsoft", 1);
      context.CountRewrite();
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFuseRotaryEmbeddingPass() { return std::make_unique<FuseRotaryEmbeddingPass>(); }

}  // namespace onnxopt
