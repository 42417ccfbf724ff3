// com.microsoft::GroupQueryAttention from a matched grouped-query block (attention_emit.h):
//   y = GroupQueryAttention(rope'(x Wq), rope'(x Wk), x Wv, , , seqlens_k, total_sequence_length, , , ,
//                           attention_bias, num_heads=N, kv_num_heads=Nkv, scale)
// K and V stay at their Nkv heads (no repeat_kv: the kernel reads each key/value head for its group of
// N / Nkv query heads); rope' as for MultiHeadAttention, or inside the kernel (do_rotary, the caches as
// cos_cache/sin_cache) where its own positions 0..S-1 read the rows RotaryEmbedding read (offset 0, no
// past): one node less per Q and K and per layer. The kernel is causal and takes each row as
// seqlens_k[b] + 1 valid tokens from the start; here every row is taken whole (seqlens_k = S - 1,
// total_sequence_length = S) and whatever else the original's mask masks goes in as attention_bias:
// the key padding of a causal + padding mask as Where(mask[b, t] != 0, 0, filter) [B, 1, S, T] (made
// once per mask input and shared by the layers), a sliding window of W keys as local_window_size = W
// beside that padding bias, another mask as Where(cond, 0, lowest). Exact where
// the mask never lets a query see a later key (MaskPlan::within_causal: the probe checks it), so the
// kernel's own causal masking removes nothing the original kept; left padding included. A float bias
// (T5's) and head sizes the CPU kernel does not take (multiples of 8 only) keep MultiHeadAttention.
// With a key/value cache (AttentionMatch::cache) the past goes in as past_key/past_value, the total
// length is P + S (seqlens_k = P + S - 1 for every row: the kernel writes the new keys at P, as the
// original's Concat does), and the node writes the model's present outputs itself.
// Q, K and V go in packed, as one [B, S, (N + 2 Nkv) D] query with no key and value, where nothing
// rotates them outside the kernel: a packed projection split in order (Phi-3's qkv_proj) as it is,
// three projections of one input as one MatMul over [Wq|Wk|Wv] (and one Add of [bq|bk|bv]). One GEMM
// and one bias instead of three of each: 4-5% of a small decoder's latency at batch 1.
#include "optimizer/passes/fusion/attention_emit.h"

#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optimizer/model_io.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt::attention {
namespace {

// The key padding of the [B, T] mask `raw_mask` as a bias [B, 1, S, T] for queries [B, S, H].
std::string PaddingBias(Graph& graph, const std::string& raw_mask, float filter, const std::string& query,
                        NodeChain* chain) {
  const std::string zero = graph.UniqueName("padding_bias_zero");
  const std::string masked = graph.UniqueName("padding_bias_masked");
  graph.AddInitializer(MakeFloatTensor(zero, {}, {0.0f}));
  graph.AddInitializer(MakeFloatTensor(masked, {}, {filter}));
  const std::string keys =
      chain->Add("Unsqueeze", {raw_mask, AddInt64Initializer(graph, "padding_bias_axes", {1, 2})}, "padding_keys");
  const std::string kept =
      chain->Add("Cast", {keys}, "padding_kept", {MakeIntAttribute("to", onnx::TensorProto::BOOL)});
  const std::string row = chain->Add("Where", {kept, zero, masked}, "padding_bias_row");  // [B, 1, 1, T]
  const std::string length = chain->Add("Slice",
                                        {chain->Add("Shape", {query}, "padding_query_shape"),
                                         AddInt64Initializer(graph, "padding_length_start", {1}),
                                         AddInt64Initializer(graph, "padding_length_end", {2})},
                                        "padding_query_length");
  const std::string one = AddInt64Initializer(graph, "padding_one", {1});
  const std::string rows = chain->Add("Concat", {one, one, length, one}, "padding_bias_rows",
                                      {MakeIntAttribute("axis", 0)});
  return chain->Add("Expand", {row, rows}, "padding_bias");
}

// The rotation goes inside the kernel (do_rotary) where the kernel's own positions read the same cache
// rows RotaryEmbedding reads: a whole-head rotation at offset 0 (row s for token s) and no past (the
// kernel then counts 0..S-1), with cache rows a multiple of 8 wide (the kernel's rule).
bool RotatesInside(const Graph& graph, const AttentionMatch& match) {
  if (!match.q_rotation || match.q_rotation->fused == nullptr || match.cache) return false;
  const Rotation& q = *match.q_rotation;
  if (!q.Whole(match.head_size) || (match.head_size / 2) % 8 != 0) return false;
  const std::optional<std::vector<int64_t>> offset = ConstantInts(graph, q.position_ids);
  return offset && offset->size() == 1 && (*offset)[0] == 0;
}

// Packed weights are new tensors held in memory (the original's stay in their files): at most this many
// bytes of them per pass run. A 7B-class decoder's would take 3 GiB, for a gain that its GEMMs' time
// makes negligible; a small one's, where one node less per layer weighs, fit many times over.
constexpr int64_t kMaxPackedProjectionBytes = int64_t{512} << 20;

// The projection value [B, S, width] the head split reads, when it is the MatMul's (or its bias Add's)
// output itself: no scaling, LoRA branch or norm in between.
bool IsPlainProjection(const Projection& p) {
  if (p.Given() || p.head_norm != nullptr || p.matmul == nullptr || p.reshape == nullptr) return false;
  const Node* last = p.part != nullptr ? p.part : p.add != nullptr ? p.add : p.matmul;
  return p.reshape->input(0) == last->output(0);
}

// The raw bytes of the constant `name` of `type`: its own when inline, else read (by reference) or
// converted (float typed fields) into `scratch`; nullptr when it has none.
const std::string* ConstantBytes(const Graph& graph, const std::string& name, int32_t type, std::string* scratch) {
  const onnx::TensorProto* tensor = graph.Initializer(name);
  if (tensor == nullptr || tensor->data_type() != type) return nullptr;
  if (const std::string* raw = RawBytes(*tensor, scratch)) return raw;
  if (type != onnx::TensorProto::FLOAT) return nullptr;
  const std::optional<std::vector<float>> floats = TensorFloats(*tensor);
  if (!floats) return nullptr;
  scratch->assign(reinterpret_cast<const char*>(floats->data()), floats->size() * sizeof(float));
  return scratch;
}

// The projections' [H_in, w_i] weights side by side as one [H_in, sum w_i] tensor, or nullopt.
std::optional<onnx::TensorProto> ConcatenateColumns(const Graph& graph, const Projection* const (&projections)[3],
                                                    const std::string& name) {
  const onnx::TensorProto* first = graph.Initializer(projections[0]->weight);
  if (first == nullptr || first->dims_size() != 2) return std::nullopt;
  const int32_t type = first->data_type();
  const size_t element = ElementSize(type);
  const int64_t rows = first->dims(0);
  std::string scratch[3];
  const std::string* parts[3];
  int64_t widths[3], total = 0;
  for (int i = 0; i < 3; ++i) {
    const onnx::TensorProto* w = graph.Initializer(projections[i]->weight);
    if (w == nullptr || w->dims_size() != 2 || w->dims(0) != rows || element == 0) return std::nullopt;
    parts[i] = ConstantBytes(graph, projections[i]->weight, type, &scratch[i]);
    widths[i] = w->dims(1);
    if (parts[i] == nullptr || parts[i]->size() != static_cast<size_t>(rows * widths[i]) * element) return std::nullopt;
    total += widths[i];
  }
  onnx::TensorProto packed;
  packed.set_name(name);
  packed.set_data_type(type);
  packed.add_dims(rows);
  packed.add_dims(total);
  std::string* out = packed.mutable_raw_data();
  out->reserve(static_cast<size_t>(rows * total) * element);
  for (int64_t row = 0; row < rows; ++row) {
    for (int i = 0; i < 3; ++i) {
      const size_t width_bytes = static_cast<size_t>(widths[i]) * element;
      out->append(*parts[i], static_cast<size_t>(row) * width_bytes, width_bytes);
    }
  }
  return packed;
}

// The projections' biases [w_i] end to end (zeros for one without), or nullopt.
std::optional<onnx::TensorProto> ConcatenateBiases(const Graph& graph, const Projection* const (&projections)[3],
                                                   int32_t type, const std::string& name) {
  onnx::TensorProto packed;
  packed.set_name(name);
  packed.set_data_type(type);
  std::string* out = packed.mutable_raw_data();
  int64_t total = 0;
  for (const Projection* p : projections) {
    const int64_t width = graph.Initializer(p->weight)->dims(1);
    total += width;
    const size_t bytes = static_cast<size_t>(width) * ElementSize(type);
    if (p->add == nullptr) {
      out->append(bytes, '\0');  // zero in every float type
      continue;
    }
    std::string scratch;
    const std::string* bias = ConstantBytes(graph, p->bias, type, &scratch);
    if (bias == nullptr || bias->size() != bytes) return std::nullopt;
    out->append(*bias);
  }
  packed.add_dims(total);
  return packed;
}

// Q, K and V packed as GroupQueryAttention's query [B, S, (N + 2 Nkv) D] (see the top), added to
// `chain`; nullopt where they cannot be (what stays reads them separately). Called after the pattern
// is removed: a projection's value must have no reader left but its head split, now unread.
std::optional<std::string> PackedQueryKeyValue(Graph& graph, const AttentionMatch& match, FusionState* state,
                                               NodeChain* chain, PassContext& context) {
  const Projection* const projections[3] = {&match.q, &match.k, &match.v};
  const int64_t kv_width = match.num_heads / match.kv_repeat() * match.head_size;
  const int64_t widths[3] = {match.num_heads * match.head_size, kv_width, kv_width};
  // The head splits the pattern read are left without readers: each projection must be read by its own only.
  for (const Projection* p : projections) {
    if (!IsPlainProjection(*p)) return std::nullopt;
    const std::string& value = p->reshape->input(0);
    const std::vector<Node*> readers = graph.Consumers(value);
    if (readers.size() != 1 || readers[0] != p->reshape || graph.IsGraphOutput(value) ||
        !graph.Consumers(p->reshape->output(0)).empty() || graph.IsGraphOutput(p->reshape->output(0))) {
      return std::nullopt;
    }
  }
  // Already packed and split in order: the packed projection is the query.
  if (match.q.part != nullptr) {
    const Projection &q = match.q, &k = match.k, &v = match.v;
    const bool in_order = k.part != nullptr && v.part != nullptr && k.matmul == q.matmul && v.matmul == q.matmul &&
                          k.add == q.add && v.add == q.add && q.offset == 0 && q.size == widths[0] &&
                          k.offset == widths[0] && k.size == widths[1] && v.offset == widths[0] + widths[1] &&
                          v.size == widths[2];
    const onnx::TensorProto* weight = graph.Initializer(q.weight);
    const std::string& packed = q.part->input(0);
    if (!in_order || weight == nullptr || weight->dims_size() != 2 ||
        weight->dims(1) != widths[0] + widths[1] + widths[2] ||
        packed != (q.add != nullptr ? q.add->output(0) : q.matmul->output(0))) {
      return std::nullopt;
    }
    return packed;
  }
  const std::string& x = match.q.matmul->input(0);
  for (int i = 0; i < 3; ++i) {
    const Projection& p = *projections[i];
    const onnx::TensorProto* weight = graph.Initializer(p.weight);
    if (p.part != nullptr || p.matmul->input(0) != x || p.matmul->input(1) != p.weight || weight == nullptr ||
        weight->dims_size() != 2 || weight->dims(1) != widths[i] ||
        (p.add != nullptr && graph.Consumers(p.matmul->output(0)).size() != 1) ||
        (i > 0 && p.matmul == projections[i - 1]->matmul)) {
      return std::nullopt;
    }
  }
  const onnx::TensorProto& q_weight = *graph.Initializer(match.q.weight);
  const int64_t bytes = q_weight.dims(0) * (widths[0] + widths[1] + widths[2]) *
                        static_cast<int64_t>(ElementSize(q_weight.data_type()));
  if (state->packed_projection_bytes + bytes > kMaxPackedProjectionBytes) {
    if (!state->packing_limit_noted) {
      state->packing_limit_noted = true;
      context.Note(absl::StrCat("Q, K and V stay three projections from here on: packing them takes new weights, "
                                "at most ", kMaxPackedProjectionBytes >> 20, " MiB of them per model"));
    }
    return std::nullopt;
  }
  std::optional<onnx::TensorProto> weight =
      ConcatenateColumns(graph, projections, graph.UniqueName("gqa_qkv_weight"));
  if (!weight) return std::nullopt;
  const bool biased = match.q.add != nullptr || match.k.add != nullptr || match.v.add != nullptr;
  std::optional<onnx::TensorProto> bias;
  if (biased) {
    bias = ConcatenateBiases(graph, projections, weight->data_type(), graph.UniqueName("gqa_qkv_bias"));
    if (!bias) return std::nullopt;
  }
  state->packed_projection_bytes += bytes;
  for (const Projection* p : projections) {
    graph.RemoveNode(p->reshape);
    if (p->add != nullptr) graph.RemoveNode(p->add);
    graph.RemoveNode(p->matmul);
  }
  const std::string weight_name = weight->name();
  graph.AddInitializer(*std::move(weight));
  std::string packed = chain->Add("MatMul", {x, weight_name}, "gqa_qkv");
  if (bias) {
    const std::string bias_name = bias->name();
    graph.AddInitializer(*std::move(bias));
    packed = chain->Add("Add", {packed, bias_name}, "gqa_qkv_biased");
  }
  return packed;
}

}  // namespace

bool GroupQueryAttentionFits(const AttentionMatch& match) {
  const MaskPlan& mask = match.mask;
  // ONNX Runtime's CPU kernel takes head sizes of multiples of 8 only. A float additive mask (older
  // transformers' clamp(causal + padding)) only over grouped K/V, where not repeating them pays (the
  // original spells an ungrouped cache as MultiHeadAttention over its heads takes it, exactly).
  return (match.k_repeat.has_value() || match.cache.has_value()) && match.head_size % 8 == 0 && mask.within_causal &&
         (mask.bias.empty() || mask.bias_within_causal) && (!mask.additive || match.k_repeat.has_value());
}

void EmitGroupQueryAttention(Graph& graph, const AttentionMatch& match, const Replacement& plan, FusionState* state,
                             PassContext& context) {
  const bool rotates_inside = RotatesInside(graph, match);
  NodeChain chain(graph, RemovePattern(graph, match, plan.pattern, plan.shape_nodes));
  std::string query, key, value;
  // The projections' input, read before packing removes their MatMuls.
  const std::string x = match.q.matmul != nullptr ? match.q.matmul->input(0) : "";
  std::optional<std::string> packed;
  if (rotates_inside || (!match.q_rotation && !match.k_rotation)) {
    packed = PackedQueryKeyValue(graph, match, state, &chain, context);
  }
  if (packed) {
    query = *packed;
  } else {
    if (rotates_inside) {
      query = ProjectedValue(graph, match.q, &chain);
      key = ProjectedValue(graph, match.k, &chain);
    } else {
      std::tie(query, key) = RotatedQueryAndKey(graph, match, &chain);
    }
    value = ProjectedValue(graph, match.v, &chain);
  }
  // What B and S are read from: the query [B, S, H], or for three projections packed here their input
  // (whose dims shape inference has named, so that the layers' shape arithmetic is one after CSE).
  const std::string& rows_source = packed && match.q.part == nullptr ? x : query;
  const MaskPlan& mask = match.mask;
  // A sliding window the kernel applies itself: ONNX Runtime 1.29's CPU kernel keeps the query's last
  // local_window_size keys, itself included (FuseAttentionTest.ASlidingWindowBecomes... pins it: W - 1
  // gives other outputs).
  const bool local_window = mask.window >= 1;
  std::string attention_bias = local_window ? "" : AttentionBias(graph, match, state, &chain);
  const std::string& padding = local_window ? mask.window_padding : mask.raw_mask;
  if (!padding.empty()) {
    std::string& shared = state->padding_biases[padding];
    if (shared.empty()) shared = PaddingBias(graph, padding, mask.filter, rows_source, &chain);
    attention_bias = shared;
  }
  // B and S of the query [B,S,H] (rows_source): seqlens_k = S - 1 per row (int32 [B]), total_sequence_length
  // = S, computed in int32 from the start (one Cast, no Unsqueeze).
  const std::string shape = chain.Add("Shape", {rows_source}, "gqa_query_shape");
  const std::string rows = chain.Add("Slice", {shape, AddInt64Initializer(graph, "gqa_batch_start", {0}),
                                               AddInt64Initializer(graph, "gqa_batch_end", {1})},
                                     "gqa_rows");
  const std::string length = chain.Add("Gather", {shape, AddInt64Scalar(graph, "gqa_length_index", 1)}, "gqa_length",
                                       {MakeIntAttribute("axis", 0)});
  // With a cache the keys are the past's and the new ones: T = P + S.
  std::string keys = length;
  if (match.cache) {
    const std::string past_shape = chain.Add("Shape", {match.cache->past_key}, "gqa_past_shape");
    const std::string past = chain.Add("Gather", {past_shape, AddInt64Scalar(graph, "gqa_past_index", 2)},
                                       "gqa_past_length", {MakeIntAttribute("axis", 0)});
    keys = chain.Add("Add", {past, length}, "gqa_total_length");
  }
  const std::string total = chain.Add("Cast", {keys}, "gqa_total_sequence_length",
                                      {MakeIntAttribute("to", onnx::TensorProto::INT32)});
  const std::string one = graph.UniqueName("gqa_one");
  graph.AddInitializer(MakeIntScalar(one, onnx::TensorProto::INT32, 1));
  const std::string last = chain.Add("Sub", {total, one}, "gqa_last_position");
  const std::string seqlens = chain.Add("Expand", {last, rows}, "gqa_seqlens_k");
  const std::string attended =
      NeedsFinishing(match) ? graph.UniqueName(match.out.output + "_attention") : match.out.output;
  std::vector<std::string> inputs = {query, key, value, "", "", seqlens, total};
  std::vector<std::string> outputs = {attended, graph.UniqueName("gqa_present_key"),
                                      graph.UniqueName("gqa_present_value")};
  if (match.cache) {
    inputs[3] = match.cache->past_key;
    inputs[4] = match.cache->past_value;
    outputs[1] = match.cache->key_concat->output(0);  // the presents, written again
    outputs[2] = match.cache->value_concat->output(0);
  }
  if (rotates_inside) {
    inputs.insert(inputs.end(), {match.q_rotation->cos_cache, match.q_rotation->sin_cache});
  } else if (!attention_bias.empty()) {
    inputs.insert(inputs.end(), {"", ""});  // no cos_cache, sin_cache
  }
  if (!attention_bias.empty()) inputs.insert(inputs.end(), {"", attention_bias});  // position_ids, attention_bias
  onnx::NodeProto gqa = MakeNode("GroupQueryAttention", graph.UniqueName("GroupQueryAttention"), std::move(inputs),
                                 std::move(outputs), "com.microsoft");
  *gqa.add_attribute() = MakeIntAttribute("num_heads", match.num_heads);
  *gqa.add_attribute() = MakeIntAttribute("kv_num_heads", match.num_heads / match.kv_repeat());
  *gqa.add_attribute() = MakeFloatAttribute("scale", match.scores.scale);
  if (local_window) *gqa.add_attribute() = MakeIntAttribute("local_window_size", mask.window);
  if (rotates_inside) {
    *gqa.add_attribute() = MakeIntAttribute("do_rotary", 1);
    *gqa.add_attribute() = MakeIntAttribute("rotary_interleaved", match.q_rotation->interleaved ? 1 : 0);
  }
  const Node* fused = chain.AddNode(std::move(gqa));
  CountRowsMaskedEntirely(match, *fused, state, context);
  if (match.cache && !state->cache_noted) {
    state->cache_noted = true;
    context.Note(absl::StrCat(fused->name(), " and the other layers' with the key/value cache run a prefill (no past) "
                              "and one-token steps at any batch size; more than one new token after a past only at "
                              "batch 1 (ONNX Runtime's GroupQueryAttention refuses it at batch > 1)"));
  }
  FinishAttentionOutput(graph, context, match, attended, fused, state);
  context.RequireOpset("com.microsoft", 1);
  context.CountRewrite();
}

}  // namespace onnxopt::attention
