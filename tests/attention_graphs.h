// Small attention blocks built by hand, static shapes ([1, 4, 16], 2 heads of 8), for the fusion tests
// that need a form no export has: a bad weight, a causal buffer beside a rotary embedding.
#ifndef ONNXOPT_TESTS_ATTENTION_GRAPHS_H_
#define ONNXOPT_TESTS_ATTENTION_GRAPHS_H_

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "onnx/onnx_pb.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"

namespace onnxopt::testing {

struct AttentionGraphOptions {
  bool rotary = false;          // LLaMA-style rotate-half embeddings on Q and K (cos/sin of duplicated halves
                                // of a position_ids [1, 4] input)
  bool causal_buffer = false;   // Where over a sliced lower-triangular [1,1,8,8] buffer before Softmax
  bool padding_mask = false;    // an attention_mask [1, 4] input as Where(mask, 0, -inf) added to the scores
  bool scalar_k_weight = false; // K projected by a rank-0 weight, without bias (not a projection matrix)
  bool grouped = false;         // one key/value head repeated to the two query heads (repeat_kv)
  bool causal_mask = false;     // the boolean Where(t <= q, 0, -inf) masking_utils builds, from Range comparisons
  int64_t rotary_dim = 0;       // with rotary: only the first rotary_dim of each head rotated (Phi), 0: all
  bool lora = false;            // peft's unmerged LoRA branch (rank 2, scale 2) added to the Q and V projections
  bool head_norm = false;       // RMSNorm of each head of Q and K between the head split and the transpose (Qwen3)
  bool projection_norm = false; // RMSNorm of the whole Q and K projections before the head split (OLMo 2)
  bool stored_tables = false;   // with rotary: cos/sin stored as [16, D] constants read at position_ids
                                // (transformers before 4.38: cos_cached[:S][position_ids])
  bool negate_by_mul = false;   // with rotary: rotate_half negates by Mul(x, -1) instead of Neg, a spelling
                                // the rotary matchers do not know (the attention core still fuses)
  bool interleaved = false;     // with rotary: GPT-J's rotate_every_two, tables with each value twice in a row
                                // (duplicate_interleave as torch.stack((t, t), -1) merged)
  bool table_inputs = false;    // with rotary: cos/sin fed as inputs [1,S,D]: nothing proves their form
  bool wide_window = false;     // with causal_mask: And a sliding window of 4096 (Mistral's), wider than the
                                // graph's 4 positions
  int64_t window = 0;           // with causal_mask: And a sliding window of this many keys (t > q - window)
  int64_t v_head_size = 0;      // V's heads this wide instead of Q's and K's (a pruned model), 0: the same
};

inline constexpr int64_t kAttentionLength = 4, kAttentionHidden = 16, kAttentionHeads = 2, kAttentionHeadSize = 8;

inline bool HasInitializer(const onnx::GraphProto& graph, const std::string& name) {
  for (const auto& tensor : graph.initializer()) {
    if (tensor.name() == name) return true;
  }
  return false;
}

// x [1,4,16] -> attention -> y [1,4,16].
inline onnx::ModelProto AttentionGraph(const AttentionGraphOptions& options) {
  const int64_t s = kAttentionLength, h = kAttentionHidden, n = kAttentionHeads, d = kAttentionHeadSize;
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {1, s, h});
  *graph.add_initializer() = MakeInt64Tensor("heads_shape", {1, s, n, d});
  const int64_t vd = options.v_head_size > 0 ? options.v_head_size : d;
  *graph.add_initializer() = MakeInt64Tensor("merged_shape", {1, s, n * vd});
  *graph.add_initializer() = FloatTensor("scale", {}, {1.0f / std::sqrt(static_cast<float>(d))});
  uint32_t seed = 1;
  const int64_t kv_heads = options.grouped ? 1 : n;
  *graph.add_initializer() = MakeInt64Tensor("kv_heads_shape", {1, s, kv_heads, d});
  if (vd != d) *graph.add_initializer() = MakeInt64Tensor("v_heads_shape", {1, s, kv_heads, vd});
  auto projection = [&](const std::string& p, bool bias) {
    const int64_t width = p == "q" ? h : kv_heads * (p == "v" ? vd : d);
    *graph.add_initializer() = FloatTensor("W" + p, {h, width}, RandomFloats(static_cast<size_t>(h * width), seed++));
    *graph.add_node() = MakeNode("MatMul", {"x", "W" + p}, {p + "_xw"});
    std::string projected = p + "_xw";
    if (bias) {
      *graph.add_initializer() = FloatTensor("b" + p, {width}, RandomFloats(static_cast<size_t>(width), seed++));
      *graph.add_node() = MakeNode("Add", {p + "_xw", "b" + p}, {p + "_proj"});
      projected = p + "_proj";
    }
    if (options.lora && (p == "q" || p == "v")) {
      constexpr int64_t kRank = 2;
      *graph.add_initializer() = FloatTensor("A" + p, {h, kRank}, RandomFloats(static_cast<size_t>(h * kRank), seed++));
      *graph.add_initializer() = FloatTensor("B" + p, {kRank, width}, RandomFloats(static_cast<size_t>(kRank * width), seed++));
      if (p == "q") *graph.add_initializer() = FloatTensor("lora_scale", {}, {2.0f});
      *graph.add_node() = MakeNode("MatMul", {"x", "A" + p}, {p + "_lora_a"});
      *graph.add_node() = MakeNode("MatMul", {p + "_lora_a", "B" + p}, {p + "_lora_b"});
      *graph.add_node() = MakeNode("Mul", {p + "_lora_b", "lora_scale"}, {p + "_lora"});
      *graph.add_node() = MakeNode("Add", {projected, p + "_lora"}, {p + "_adapted"});
      projected = p + "_adapted";
    }
    // RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * gamma.
    auto rms_norm = [&](const std::string& x, int64_t width) {
      if (!HasInitializer(graph, "two_f")) {
        *graph.add_initializer() = FloatTensor("two_f", {}, {2.0f});
        *graph.add_initializer() = FloatTensor("norm_eps", {}, {1e-6f});
      }
      *graph.add_initializer() = FloatTensor("gamma_" + x, {width}, RandomFloats(static_cast<size_t>(width), seed++));
      *graph.add_node() = MakeNode("Pow", {x, "two_f"}, {x + "_sq"});
      *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {x + "_sq"}, {x + "_ms"}), "axes", {-1});
      *graph.add_node() = MakeNode("Add", {x + "_ms", "norm_eps"}, {x + "_ms_eps"});
      *graph.add_node() = MakeNode("Sqrt", {x + "_ms_eps"}, {x + "_rms"});
      *graph.add_node() = MakeNode("Div", {x, x + "_rms"}, {x + "_normed"});
      *graph.add_node() = MakeNode("Mul", {x + "_normed", "gamma_" + x}, {x + "_rms_normed"});
      return x + "_rms_normed";
    };
    if (options.projection_norm && p != "v") projected = rms_norm(projected, width);
    *graph.add_node() =
        MakeNode("Reshape", {projected, p == "q" ? "heads_shape" : p == "v" && vd != d ? "v_heads_shape" : "kv_heads_shape"}, {p + "_4d"});
    std::string split = p + "_4d";
    if (options.head_norm && p != "v") split = rms_norm(split, d);
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {split}, {p + "_heads"}), "perm", {0, 2, 1, 3});
    return p + "_heads";
  };
  std::string q = projection("q", !options.rotary);
  std::string k;
  if (options.scalar_k_weight) {
    *graph.add_initializer() = FloatTensor("Wk", {}, {0.5f});
    *graph.add_node() = MakeNode("MatMul", {"x", "Wk"}, {"k_xw"});
    *graph.add_node() = MakeNode("Reshape", {"k_xw", "heads_shape"}, {"k_4d"});
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"k_4d"}, {"k_heads"}), "perm", {0, 2, 1, 3});
    k = "k_heads";
  } else {
    k = projection("k", !options.rotary);
  }
  std::string v = projection("v", !options.rotary);
  // transformers' repeat_kv: [B,1,S,D] -> Unsqueeze(2) -> Expand([B,1,2,S,D]) -> Reshape([B,2,S,D]).
  auto repeat_kv = [&](const std::string& x) {
    if (!options.grouped) return x;
    if (graph.node_size() > 0 && !HasInitializer(graph, "repeat_axis")) {
      *graph.add_initializer() = MakeInt64Tensor("repeat_axis", {2});
      *graph.add_initializer() = MakeInt64Tensor("repeat_sizes", {1, 1, n, s, d});
      *graph.add_initializer() = MakeInt64Tensor("repeat_merged", {1, n, s, d});
    }
    *graph.add_node() = MakeNode("Unsqueeze", {x, "repeat_axis"}, {x + "_5d"});
    *graph.add_node() = MakeNode("Expand", {x + "_5d", "repeat_sizes"}, {x + "_expanded"});
    *graph.add_node() = MakeNode("Reshape", {x + "_expanded", "repeat_merged"}, {x + "_repeated"});
    return x + "_repeated";
  };
  v = repeat_kv(v);
  if (options.rotary) {
    // cos/sin [1,S,D] of Concat(f, f), f = positions x inverse frequencies, as Hugging Face's rotary
    // classes compute them from the position_ids input.
    const int64_t r = options.rotary_dim > 0 ? options.rotary_dim : d;  // the rotated dims of each head
    std::vector<float> inverse_frequencies;
    for (int64_t i = 0; i < r / 2; ++i) inverse_frequencies.push_back(std::pow(10000.0f, -2.0f * i / r));
    *graph.add_input() = MakeValue("position_ids", onnx::TensorProto::INT64, {1, s});
    *graph.add_initializer() = FloatTensor("inv_freq", {r / 2}, inverse_frequencies);
    *graph.add_initializer() = MakeInt64Tensor("minus_one_axis", {-1});
    if (options.stored_tables) {
      constexpr int64_t kPositions = 16;
      std::vector<float> cos_table, sin_table;
      for (int64_t p = 0; p < kPositions; ++p) {
        for (int copy = 0; copy < 2; ++copy) {
          for (float f : inverse_frequencies) {
            cos_table.push_back(std::cos(static_cast<float>(p) * f));
            sin_table.push_back(std::sin(static_cast<float>(p) * f));
          }
        }
      }
      *graph.add_initializer() = FloatTensor("cos_cached", {kPositions, r}, cos_table);
      *graph.add_initializer() = FloatTensor("sin_cached", {kPositions, r}, sin_table);
      *graph.add_initializer() = MakeInt64Tensor("rows_start", {0});
      *graph.add_initializer() = MakeInt64Tensor("rows_end", {s});
      *graph.add_initializer() = MakeInt64Tensor("rows_axis", {0});
      *graph.add_node() = MakeNode("Slice", {"cos_cached", "rows_start", "rows_end", "rows_axis"}, {"cos_rows"});
      *graph.add_node() = MakeNode("Slice", {"sin_cached", "rows_start", "rows_end", "rows_axis"}, {"sin_rows"});
      *graph.add_node() = MakeNode("Gather", {"cos_rows", "position_ids"}, {"cos"});
      *graph.add_node() = MakeNode("Gather", {"sin_rows", "position_ids"}, {"sin"});
    } else if (options.table_inputs) {
      *graph.add_input() = FloatValue("cos", {1, s, r});
      *graph.add_input() = FloatValue("sin", {1, s, r});
    } else {
      *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"position_ids"}, {"positions"}), "to", onnx::TensorProto::FLOAT);
      *graph.add_node() = MakeNode("Unsqueeze", {"positions", "minus_one_axis"}, {"positions_3d"});
      *graph.add_node() = MakeNode("Mul", {"positions_3d", "inv_freq"}, {"freqs"});
      if (options.interleaved) {
        // duplicate_interleave: [1,S,r/2] -> [1,S,r/2,2] -> [1,S,r], each value twice in a row.
        *graph.add_initializer() = MakeInt64Tensor("table_shape", {1, s, r});
        for (const auto& [op, t] : {std::pair<std::string, std::string>{"Cos", "cos"}, {"Sin", "sin"}}) {
          *graph.add_node() = MakeNode(op, {"freqs"}, {t + "_half"});
          *graph.add_node() = MakeNode("Unsqueeze", {t + "_half", "minus_one_axis"}, {t + "_pair"});
          *graph.add_node() = WithIntAttribute(MakeNode("Concat", {t + "_pair", t + "_pair"}, {t + "_pairs"}), "axis", -1);
          *graph.add_node() = MakeNode("Reshape", {t + "_pairs", "table_shape"}, {t});
        }
      } else {
        *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"freqs", "freqs"}, {"emb"}), "axis", -1);
        *graph.add_node() = MakeNode("Cos", {"emb"}, {"cos"});
        *graph.add_node() = MakeNode("Sin", {"emb"}, {"sin"});
      }
    }
    *graph.add_initializer() = MakeInt64Tensor("one_axis", {1});
    *graph.add_node() = MakeNode("Unsqueeze", {"cos", "one_axis"}, {"cos_u"});
    *graph.add_node() = MakeNode("Unsqueeze", {"sin", "one_axis"}, {"sin_u"});
    *graph.add_initializer() = MakeInt64Tensor("half", {r / 2});
    *graph.add_initializer() = MakeInt64Tensor("rotated", {r});
    *graph.add_initializer() = MakeInt64Tensor("zero", {0});
    *graph.add_initializer() = MakeInt64Tensor("end", {std::numeric_limits<int64_t>::max()});
    *graph.add_initializer() = MakeInt64Tensor("last", {-1});
    auto rope_all = [&](const std::string& x) {
      if (options.interleaved) {
        // rotate_every_two: Reshape(Concat(Unsqueeze(-x[..., 1::2]), Unsqueeze(x[..., ::2]), -1), x's shape).
        if (!HasInitializer(graph, "two")) {
          *graph.add_initializer() = MakeInt64Tensor("two", {2});
          *graph.add_initializer() = MakeInt64Tensor("one", {1});
          *graph.add_initializer() = MakeInt64Tensor("pairs_merged", {0, 0, 0, -1});
        }
        *graph.add_node() = MakeNode("Slice", {x, "zero", "end", "last", "two"}, {x + "_even"});
        *graph.add_node() = MakeNode("Slice", {x, "one", "end", "last", "two"}, {x + "_odd"});
        *graph.add_node() = MakeNode("Neg", {x + "_odd"}, {x + "_neg"});
        *graph.add_node() = MakeNode("Unsqueeze", {x + "_neg", "minus_one_axis"}, {x + "_neg_pair"});
        *graph.add_node() = MakeNode("Unsqueeze", {x + "_even", "minus_one_axis"}, {x + "_even_pair"});
        *graph.add_node() =
            WithIntAttribute(MakeNode("Concat", {x + "_neg_pair", x + "_even_pair"}, {x + "_pairs"}), "axis", -1);
        *graph.add_node() = MakeNode("Reshape", {x + "_pairs", "pairs_merged"}, {x + "_rot"});
        *graph.add_node() = MakeNode("Mul", {x, "cos_u"}, {x + "_cos"});
        *graph.add_node() = MakeNode("Mul", {x + "_rot", "sin_u"}, {x + "_sin"});
        *graph.add_node() = MakeNode("Add", {x + "_cos", x + "_sin"}, {x + "_roped"});
        return x + "_roped";
      }
      *graph.add_node() = MakeNode("Slice", {x, "zero", "half", "last"}, {x + "_x1"});
      *graph.add_node() = MakeNode("Slice", {x, "half", "end", "last"}, {x + "_x2"});
      if (options.negate_by_mul) {
        if (!HasInitializer(graph, "minus_one_f")) *graph.add_initializer() = FloatTensor("minus_one_f", {}, {-1.0f});
        *graph.add_node() = MakeNode("Mul", {x + "_x2", "minus_one_f"}, {x + "_neg"});
      } else {
        *graph.add_node() = MakeNode("Neg", {x + "_x2"}, {x + "_neg"});
      }
      *graph.add_node() = WithIntAttribute(MakeNode("Concat", {x + "_neg", x + "_x1"}, {x + "_rot"}), "axis", -1);
      *graph.add_node() = MakeNode("Mul", {x, "cos_u"}, {x + "_cos"});
      *graph.add_node() = MakeNode("Mul", {x + "_rot", "sin_u"}, {x + "_sin"});
      *graph.add_node() = MakeNode("Add", {x + "_cos", x + "_sin"}, {x + "_roped"});
      return x + "_roped";
    };
    // Phi's partial rotation: Concat(rope(x[..., :r]), x[..., r:]).
    auto rope = [&](const std::string& x) {
      if (r == d) return rope_all(x);
      *graph.add_node() = MakeNode("Slice", {x, "zero", "rotated", "last"}, {x + "_rot_part"});
      *graph.add_node() = MakeNode("Slice", {x, "rotated", "end", "last"}, {x + "_pass_part"});
      const std::string roped = rope_all(x + "_rot_part");
      *graph.add_node() = WithIntAttribute(MakeNode("Concat", {roped, x + "_pass_part"}, {x + "_partly_roped"}), "axis", -1);
      return x + "_partly_roped";
    };
    q = rope(q);
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {repeat_kv(rope(k))}, {"k_t"}), "perm", {0, 1, 3, 2});
  } else {
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {repeat_kv(k)}, {"k_t"}), "perm", {0, 1, 3, 2});
  }
  *graph.add_node() = MakeNode("MatMul", {q, "k_t"}, {"qk"});
  *graph.add_node() = MakeNode("Mul", {"qk", "scale"}, {"scores"});
  std::string scores = "scores";
  *graph.add_initializer() = FloatTensor("zero_f", {}, {0.0f});
  *graph.add_initializer() = FloatTensor("minus_inf", {}, {-std::numeric_limits<float>::infinity()});
  // The boolean masks, combined into one Where(cond, 0, -inf) added to the scores as masking_utils does.
  std::vector<std::string> conds;
  if (options.padding_mask) {
    *graph.add_input() = MakeValue("attention_mask", onnx::TensorProto::INT64, {1, s});
    *graph.add_initializer() = MakeInt64Tensor("mask_axes", {1, 2});
    *graph.add_node() = MakeNode("Unsqueeze", {"attention_mask", "mask_axes"}, {"mask_4d"});
    *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"mask_4d"}, {"mask_bool"}), "to", onnx::TensorProto::BOOL);
    conds.push_back("mask_bool");
  }
  if (options.causal_mask) {
    // cond[q, t] = t <= q over Range(0, S), as masking_utils compares positions.
    *graph.add_initializer() = MakeIntScalar("range_start", onnx::TensorProto::INT64, 0);
    *graph.add_initializer() = MakeIntScalar("range_limit", onnx::TensorProto::INT64, s);
    *graph.add_initializer() = MakeIntScalar("range_step", onnx::TensorProto::INT64, 1);
    *graph.add_initializer() = MakeInt64Tensor("row_axis", {0});
    *graph.add_initializer() = MakeInt64Tensor("column_axis", {1});
    *graph.add_initializer() = MakeInt64Tensor("batch_head_axes", {0, 1});
    *graph.add_node() = MakeNode("Range", {"range_start", "range_limit", "range_step"}, {"positions_range"});
    *graph.add_node() = MakeNode("Unsqueeze", {"positions_range", "row_axis"}, {"key_positions"});      // [1, S]
    *graph.add_node() = MakeNode("Unsqueeze", {"positions_range", "column_axis"}, {"query_positions"}); // [S, 1]
    *graph.add_node() = MakeNode("LessOrEqual", {"key_positions", "query_positions"}, {"causal_2d"});
    *graph.add_node() = MakeNode("Unsqueeze", {"causal_2d", "batch_head_axes"}, {"causal_cond"});
    conds.push_back("causal_cond");
    if (options.wide_window || options.window > 0) {
      // t > q - W, as transformers' sliding-window masks compare positions.
      *graph.add_initializer() =
          MakeIntScalar("window", onnx::TensorProto::INT64, options.wide_window ? 4096 : options.window);
      *graph.add_node() = MakeNode("Sub", {"query_positions", "window"}, {"window_start"});
      *graph.add_node() = MakeNode("Greater", {"key_positions", "window_start"}, {"window_2d"});
      *graph.add_node() = MakeNode("Unsqueeze", {"window_2d", "batch_head_axes"}, {"window_cond"});
      conds.push_back("window_cond");
    }
  }
  if (!conds.empty()) {
    std::string cond = conds[0];
    for (size_t i = 1; i < conds.size(); ++i) {
      const std::string both = "mask_cond" + (i == 1 ? std::string() : std::to_string(i));
      *graph.add_node() = MakeNode("And", {cond, conds[i]}, {both});
      cond = both;
    }
    *graph.add_node() = MakeNode("Where", {cond, "zero_f", "minus_inf"}, {"mask_term"});
    *graph.add_node() = MakeNode("Add", {scores, "mask_term"}, {"masked_scores"});
    scores = "masked_scores";
  }
  if (options.causal_buffer) {
    onnx::TensorProto buffer;
    buffer.set_name("causal_buffer");
    buffer.set_data_type(onnx::TensorProto::BOOL);
    for (int64_t dim : {1, 1, 8, 8}) buffer.add_dims(dim);
    std::string raw;
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 8; ++j) raw.push_back(j <= i ? 1 : 0);
    }
    buffer.set_raw_data(raw);
    *graph.add_initializer() = buffer;
    *graph.add_initializer() = MakeInt64Tensor("causal_starts", {0, 0});
    *graph.add_initializer() = MakeInt64Tensor("causal_ends", {s, s});
    *graph.add_initializer() = MakeInt64Tensor("causal_axes", {2, 3});
    *graph.add_node() = MakeNode("Slice", {"causal_buffer", "causal_starts", "causal_ends", "causal_axes"}, {"causal"});
    *graph.add_node() = MakeNode("Where", {"causal", scores, "minus_inf"}, {"causal_scores"});
    scores = "causal_scores";
  }
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {scores}, {"probs"}), "axis", -1);
  *graph.add_node() = MakeNode("MatMul", {"probs", v}, {"context"});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"context"}, {"context_t"}), "perm", {0, 2, 1, 3});
  *graph.add_node() = MakeNode("Reshape", {"context_t", "merged_shape"}, {"y"});
  *graph.add_output() = FloatValue("y", {1, s, n * vd});
  // Declared as exporters declare them: a model whose inference stops early still shows its ranks.
  for (const char* value : {"qk", "scores", "probs"}) *graph.add_value_info() = FloatValue(value, {1, n, s, s});
  return MakeModel(graph, 17);
}

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_ATTENTION_GRAPHS_H_
