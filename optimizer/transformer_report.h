// What kind of transformer a model is, and whether the transformer fusions covered it: the family
// (BERT or RoBERTa encoder, GPT-2-like decoder, LLaMA-like decoder, T5 encoder, ViT), layer count, heads and width are read from
// the original graph (or taken from the config), and the optimized model's fused operators are
// counted against what a fully fused model of that family has, naming the pattern that stopped
// where one is short.
#ifndef ONNXOPT_OPTIMIZER_TRANSFORMER_REPORT_H_
#define ONNXOPT_OPTIMIZER_TRANSFORMER_REPORT_H_

#include <vector>

#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/pass.h"

namespace onnxopt {

struct TransformerShape {
  std::string family;  // "bert", "roberta", "gpt2", "llama", "t5", "vit", or "" when the graph has no attention
  int layers = 0;      // attention Softmaxes
  int num_heads = 0;
  int hidden_size = 0;
};

// Reads the family from the original graph: attention Softmaxes (layers); a convolution before the
// first attention with no token lookups (ViT); RMSNorm with rotary Sin/Cos (LLaMA) or with log-bucketed
// relative positions (T5); a causal mask, as a lower-triangular buffer, Trilu, two position ranges
// compared (GPT-2; the report also counts an Attention the fusion proved unidirectional); positions
// counted by CumSum (RoBERTa); else an encoder (BERT).
TransformerShape DetectTransformer(const onnx::ModelProto& original);

// What detection reads from the original graph, taken before the pipeline so that the original need
// not be kept for the report alone.
struct TransformerEvidence {
  int layers = 0;
  bool causal = false, token_lookup = false, convolution = false, rms_norm = false, sine = false, cosine = false,
       log_buckets = false, cumulative_positions = false;
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
