// What kind of transformer a model is, and whether the transformer fusions covered it: the family
// (bert, distilbert, roberta, xlm-roberta, modernbert, gpt2, clip, llama, mistral, qwen2, qwen3, phi3,
// gemma, t5, vit, deit, dinov2, whisper), layer count, heads and width are read from the original
// graph (or taken from the config), and the optimized model's fused operators are counted against
// what a fully fused model of that family's kind (FamilyKind) has, naming the pattern that stopped
// where one is short.
#ifndef ONNXOPT_OPTIMIZER_TRANSFORMER_REPORT_H_
#define ONNXOPT_OPTIMIZER_TRANSFORMER_REPORT_H_

#include <vector>

#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/pass.h"

namespace onnxopt {

// The families detection names, and the kind each is of: the architecture whose fused operator
// counts it shares ("bert", "roberta", "gpt2", "llama", "t5", "vit").
const std::vector<std::pair<std::string, std::string>>& KnownFamilies();
// The kind of `family` (a kind is its own), or "" for a name not known.
std::string FamilyKind(const std::string& family);

struct TransformerShape {
  std::string family;  // a KnownFamilies() name, or "" when the graph has no attention
  int layers = 0;      // attention Softmaxes
  int cross_attention = 0;  // of them, cross-attention (an encoder-decoder's decoder)
  int num_heads = 0;
  int hidden_size = 0;
};

// Reads the family from the original graph's structure (never from names, which exporters change):
// attention Softmaxes (layers);
// - a convolution before the first attention with no token lookups: vision or audio (vit); a 1-D
//   convolution (whisper's encoder), class and distillation tokens concatenated with the patches
//   (deit), a per-channel layer scale after the projections (dinov2);
// - RMSNorm with log-bucketed relative positions (t5);
// - RMSNorm with rotary positions (Sin/Cos, or rotate_half's Neg over stored tables) or a causal mask: a
//   decoder (llama); the embedding scaled by a constant (gemma), RMSNorm on the heads of Q and K (qwen3),
//   a packed projection split into parts (phi3), biased head-split projections (qwen2), a position window
//   in the mask (mistral);
// - rotary positions without RMSNorm: in an encoder (modernbert), in a decoder (gptneox);
// - a causal mask, as a lower-triangular buffer, Trilu, two position ranges compared (gpt2; the
//   report also counts an Attention the fusion proved unidirectional); with the sigmoid Gelu x *
//   sigmoid(1.702 x) (clip's text model);
// - positions counted by CumSum (roberta; xlm-roberta with a vocabulary of 250k tokens or more);
// - else an encoder: bert with a token-type table, distilbert without one.
TransformerShape DetectTransformer(const onnx::ModelProto& original);

// What detection reads from the original graph, taken before the pipeline so that the original need
// not be kept for the report alone.
struct TransformerEvidence {
  int layers = 0;         // attention blocks
  int cross_attention = 0;  // of them, cross-attention: Q reads a graph input its K does not (an encoder's K)
  bool causal = false, token_lookup = false, convolution = false, rms_norm = false, sine = false, cosine = false,
       log_buckets = false, cumulative_positions = false;
  // rotate_half's or rotate_every_two's Neg joined back by a Concat (directly or unsqueezed), or a
  // RotaryEmbedding: rotary positions whose tables the graph reads rather than computes.
  bool rotate_half = false;
  // What tells the families of a kind apart.
  bool audio_convolution = false, distillation_token = false, layer_scale = false, embedding_scale = false,
       head_norm = false, packed_projection = false, projection_bias = false, position_window = false,
       sigmoid_gelu = false, token_types = false;
  // A depthwise Conv1d (groups = channels, one input channel a group): a Conformer block's convolution
  // module (ESPnet, WeNet, NeMo speech encoders).
  bool depthwise_convolution = false;
  // Token lookups added to a slice of a position table, not a lookup by position ids: Whisper's decoder.
  bool sliced_positions = false;
  int64_t vocabulary = 0;  // rows of the largest table an integer input looks up
  // Lookups (Gathers) into 2-D constant tables of more than 16 rows: word and position tables. Under 2,
  // no EmbedLayerNormalization can take the embeddings (TF1 BERT's constant positions, Whisper's sliced
  // ones, BERT's token types as OneHot @ table).
  int embedding_lookups = 0;
};
TransformerEvidence ReadTransformerEvidence(const onnx::ModelProto& original);

// The report section: the family as DetectTransformer reads it, GPT-2 also where the optimized model
// has an Attention the fusion proved unidirectional; `hints` override what detection found; `passes`
// give the skip reasons of each fusion's last run. Empty family: the model is no transformer and the
// section stays empty.
v1::TransformerReport JudgeTransformerFusion(const TransformerEvidence& original, const onnx::ModelProto& optimized,
                                             const std::vector<v1::PassReport>& passes, const ModelHints& hints);
v1::TransformerReport JudgeTransformerFusion(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                                             const std::vector<v1::PassReport>& passes, const ModelHints& hints);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_TRANSFORMER_REPORT_H_
