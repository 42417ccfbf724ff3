// Rotary position embeddings (LLaMA and most decoders since) on attention heads [B,N,S,D], in the
// two forms the attention fusion meets them: as the exporters write them element-wise,
//   rope(x) = x * cos + rotate_half(x) * sin,  rotate_half(x) = Concat(-x[..., h:], x[..., :h]),
// or interleaved (GPT-J, NeoX-style checkpoints): the pairs (x[2i], x[2i+1]) rotate,
//   rope(x) = x * cos + rotate_every_two(x) * sin,
//   rotate_every_two(x) = Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1), -1), x's shape),
// with cos/sin [B',S,D] (B' = 1 or B) unsqueezed on the head axis, and as the com.microsoft
// RotaryEmbedding that fuse_rotary_embedding makes of them.
#ifndef ONNXOPT_OPTIMIZER_PASSES_FUSION_ROTARY_H_
#define ONNXOPT_OPTIMIZER_PASSES_FUSION_ROTARY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "optimizer/graph.h"
#include "optimizer/passes/match.h"
#include "optimizer/shape_info.h"

namespace onnxopt {

struct Rotation {
  std::vector<Node*> nodes;  // element-wise: Add, both Muls, Concat, Neg, both Slices; fused: the node
  std::string heads;         // the rotated x [B,N,S,D]
  // Partial rotation (Phi-2/3, GPT-NeoX's rotary_pct): only the first `rotary_dim` of each head is
  // rotated, Concat(rotate(x[..., :r]), x[..., r:]); 0: the whole head. `nodes` then also holds the
  // Concat and both Slices.
  int64_t rotary_dim = 0;
  // Whether every dim of a head of `head_size` is rotated.
  bool Whole(int64_t head_size) const { return rotary_dim == 0 || rotary_dim == head_size; }
  // Element-wise: the cos/sin tables and half of D. The tables are [B',S,D] before their Unsqueeze on
  // the head axis (table_rank 3), [B'|1, 1, S, D] (4) or [S, D] (2), as the rotation multiplies by them.
  std::string cos, sin;
  int table_rank = 3;
  int64_t half = 0;
  // Pairs (x[2i], x[2i+1]) rotate instead of halves: the tables then repeat each value twice in a row.
  bool interleaved = false;
  // Fused: RotaryEmbedding(heads, position_ids, cos_cache, sin_cache), interleaved as above.
  Node* fused = nullptr;
  std::string position_ids, cos_cache, sin_cache;
};

// The rotation that produces `value`: a RotaryEmbedding node (4-D, whole head rotated), or the
// element-wise form (either rotation); either on the first r of each head, concatenated with the rest
// (partial). Fails with a reason where `value` has a rotation's shape (an Add of a Mul by
// Concat(Neg(..), ..)) in a form not recognized.
MatchResult<Rotation> MatchRotation(const Graph& graph, const ShapeInfo& shapes, const std::string& value);

// True if both halves of `table`'s last axis hold the same values, so that its first half is the cache
// RotaryEmbedding reads: op(Concat(t, t)) on t's last axis (Hugging Face's cat(freqs, freqs).cos()), or
// a float constant whose rows repeat their first half (a stored cos_cached), then scalar Muls/Divs
// (attention_scaling), Casts to float, Unsqueezes before the last axis and Slices of other axes (a
// stored [1,1,P,D] buffer cut to [1,1,S,D]).
bool IsDuplicatedHalfTable(const Graph& graph, const ShapeInfo& shapes, const std::string& table, const char* op);

// The same for an interleaved rotation's table: every value twice in a row on the last axis, so that
// its even elements are the cache. Reshape(Concat(Unsqueeze(t, -1), Unsqueeze(t, -1), -1)) merging the
// last two axes (GPT-J's duplicate_interleave, torch.stack((t, t), -1)), or a float constant whose pairs
// repeat, behind the same Casts, scales, Unsqueezes and Slices.
bool IsDuplicatedPairTable(const Graph& graph, const ShapeInfo& shapes, const std::string& table);

// A table stored in the model instead (transformers before 4.38: cos_cached[:S][position_ids]):
// Gather(T, ids) on axis 0, T a float constant [P, D] (or its Slice from row 0) whose rows repeat their
// first half. Its first halves are RotaryEmbedding's cache as they are, and ids its position ids.
struct StoredTable {
  const onnx::TensorProto* table = nullptr;  // T
  std::string ids;
};
std::optional<StoredTable> MatchStoredTable(const Graph& graph, const std::string& value);
struct StoredTables {
  StoredTable cos, sin;
};

// What RotaryEmbedding reads besides the heads, built once per cos/sin table pair and shared by every
// layer that rotates with it.
struct RotaryInputs {
  std::string position_ids, cos_cache, sin_cache;
};

// The caches (first halves of the cos/sin tables [B',S,D] as rows [B'*S, D/2], their even elements
// for an interleaved rotation; of stored tables, their
// first halves as constants [P, D/2] read at the Gather's ids) and position ids
// (position (b, s) reads row (b mod B')*S + s: the offset 0 where B' is known to be 1, else
// Expand(Reshape(Range(0, B'*S), [-1, S]), [B, S]) with B and S those of `heads`, [B,N,S,D]) for
// `rotation`'s tables, added after `at` (which moves past them) when `cache` has none yet.
// `stored`: the rotation's tables where they are stored ones (the caller checked them).
const RotaryInputs& RotaryInputsFor(Graph& graph, const ShapeInfo& shapes, const Rotation& rotation,
                                    const std::optional<StoredTables>& stored,
                                    std::map<std::string, RotaryInputs>* cache, const Node** at);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_FUSION_ROTARY_H_
