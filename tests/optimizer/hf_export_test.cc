// The transformer preset on real Hugging Face transformers 5.17 exports (torch 2.11's TorchScript
// exporter at opset 17 and its dynamo exporter at opset 20; tests/fixtures/hf, made by export_hf.py): SDPA attention (sqrt-scale on Q and
// K^T, a boolean mask built by masking_utils, the IsNaN guard), eager attention (finfo.min mask),
// ViT's all-true mask, GPT-2's causal + padding mask and T5's position bias fuse into Attention, LLaMA's
// rotary attention into MultiHeadAttention; the second set's families (DistilBERT, XLM-RoBERTa, CLIP
// text, DeiT, ModernBERT, LoRA-adapted BERT and LLaMA, grouped-query Qwen2, Mistral and Phi-3) likewise; the report
// names each family; and ONNX Runtime gives the same outputs on padded batches.
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/transformer_report.h"
#include "optimizer/validation/parity.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

struct Export {
  const char* name;
  std::map<std::string, int> fused;  // operator -> count in the optimized model
  const char* family;
  bool has_mask;
  bool causal = false;  // a decoder's mask: a fused MultiHeadAttention with key padding is unidirectional
  int64_t max_length = 128;  // the longest sequence its position table takes
};

const Export kExports[] = {
    {"bert_torchscript", {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "bert", true},
    {"bert_eager_torchscript", {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "bert", true},
    // RoBERTa's token types: transformers 5 reads an all-zero buffer through the position ids, one
    // constant row that goes into the word table of EmbedLayerNormalization. GPT-2: Shape reads of the
    // word lookup move to the fused output.
    {"roberta_cls_torchscript", {{"Attention", 2}, {"BiasGelu", 2}, {"EmbedLayerNormalization", 1}}, "roberta", true},
    {"gpt2_torchscript", {{"Attention", 2}, {"FastGelu", 2}, {"EmbedLayerNormalization", 1}}, "gpt2", true},
    {"vit_torchscript", {{"Attention", 2}, {"BiasGelu", 2}}, "vit", false},
    // torch.export (dynamo) at opset 20: K^T as Reshape -> 3-D Transpose -> Reshape, GatherND masks, ONNX's
    // own Gelu after the bias Add (BiasGelu, FastGelu for approximate="tanh").
    {"bert_dynamo", {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "bert", true},
    {"bert_eager_dynamo", {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "bert", true},
    {"roberta_cls_dynamo", {{"Attention", 2}, {"BiasGelu", 2}, {"EmbedLayerNormalization", 1}}, "roberta", true},
    {"vit_dynamo", {{"Attention", 2}, {"BiasGelu", 2}}, "vit", false},
    // Packed QKV split by Split(num_outputs), no projection bias, heads merged to [B*S, H] for a Gemm.
    {"gpt2_dynamo", {{"Attention", 2}, {"EmbedLayerNormalization", 1}, {"FastGelu", 2}}, "gpt2", true},
    // Relative position bias (plus the padding mask) as Attention's attention_bias, no scaling; the
    // key length the bias reads from K comes from the input instead (canonicalize_shape_reads).
    {"t5_encoder_torchscript", {{"Attention", 2}}, "t5", true},
    // Rotary embeddings on Q and K after the head split: RotaryEmbedding on the projections (its caches
    // the first halves of the cos/sin tables), then MultiHeadAttention.
    {"llama_torchscript", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}, {"SkipSimplifiedLayerNormalization", 4}}, "llama", true, true},
    {"llama_dynamo", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}, {"SkipSimplifiedLayerNormalization", 4}}, "llama", true, true},
    // Whisper's encoder scales Q before its head split (q_proj(x) * scaling), K has no bias and there is
    // no mask: the scale goes into Attention's.
    {"whisper_encoder_torchscript", {{"Attention", 2}, {"BiasGelu", 2}, {"SkipLayerNormalization", 5}}, "whisper", false},
    {"whisper_encoder_dynamo", {{"Attention", 2}, {"BiasGelu", 2}, {"SkipLayerNormalization", 5}}, "whisper", false},
    // The second set (hidden 64, 2 query heads sharing 1 key/value head in the decoders).
    {"distilbert_torchscript", {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "distilbert", true},
    {"distilbert_dynamo", {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "distilbert", true},
    // XLM-RoBERTa is RoBERTa's architecture; with this fixture's 500-token vocabulary it reads as roberta.
    {"xlm_roberta_cls_torchscript", {{"Attention", 2}, {"BiasGelu", 2}, {"EmbedLayerNormalization", 1}}, "roberta", true},
    {"xlm_roberta_cls_dynamo", {{"Attention", 2}, {"BiasGelu", 2}, {"EmbedLayerNormalization", 1}}, "roberta", true},
    // CLIP's text model: causal plus padding, x * sigmoid(1.702 x) as QuickGelu.
    {"clip_text_torchscript", {{"Attention", 2}, {"QuickGelu", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}}, "clip", true, true, 77},
    {"clip_text_dynamo", {{"Attention", 2}, {"QuickGelu", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}}, "clip", true, true, 77},
    // Unmerged LoRA on query and value: x W + b + s (x A) B stays as it is, outside MultiHeadAttention.
    {"bert_lora_torchscript", {{"MultiHeadAttention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}}, "bert", true},
    {"bert_lora_dynamo", {{"MultiHeadAttention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}}, "bert", true},
    {"llama_lora_torchscript", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}}, "llama", true, true},
    {"llama_lora_dynamo", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}}, "llama", true, true},
    // DeiT: class and distillation tokens.
    {"deit_torchscript", {{"Attention", 2}, {"BiasGelu", 2}, {"SkipLayerNormalization", 5}}, "deit", false},
    {"deit_dynamo", {{"Attention", 2}, {"BiasGelu", 2}, {"SkipLayerNormalization", 5}}, "deit", false},
    // Grouped-query decoders: GroupQueryAttention with K and V at their own heads, packed with Q into one
    // projection, and the rotation inside it (do_rotary, no RotaryEmbedding left), the key padding as its attention_bias (repeat_kv's sizes in the dynamo export are Concats of Shape slices, read by shape
    // tracking at opset 20).
    {"qwen2_torchscript", {{"GroupQueryAttention", 2}, {"RotaryEmbedding", 0}, {"SkipSimplifiedLayerNormalization", 4}}, "qwen2", true, true},
    {"qwen2_dynamo", {{"GroupQueryAttention", 2}, {"RotaryEmbedding", 0}, {"SkipSimplifiedLayerNormalization", 4}}, "qwen2", true, true},
    // Mistral's sliding window (4096) is past what the mask probe can check, but the mask is an And
    // with a conjunct the probe shows causal: GroupQueryAttention with the whole mask as its
    // attention_bias, exact at every length.
    {"mistral_torchscript", {{"GroupQueryAttention", 2}, {"RotaryEmbedding", 0}, {"SkipSimplifiedLayerNormalization", 4}}, "mistral", true, true},
    {"mistral_dynamo", {{"GroupQueryAttention", 2}, {"RotaryEmbedding", 0}, {"SkipSimplifiedLayerNormalization", 4}}, "mistral", true, true},
    // Phi-3's packed qkv_proj: GroupQueryAttention reads it as it is.
    {"phi3_dynamo", {{"GroupQueryAttention", 2}, {"RotaryEmbedding", 0}, {"SkipSimplifiedLayerNormalization", 4}}, "phi3", true, true},
    // TorchScript writes Phi-3's rotation as partial (Concat(rotate(q[..., :r]), q[..., r:]), r the whole head here).
    {"phi3_torchscript", {{"GroupQueryAttention", 2}, {"RotaryEmbedding", 0}, {"SkipSimplifiedLayerNormalization", 4}}, "phi3", true, true},
    // ModernBERT: rotary in an encoder, packed Wqkv split into heads first (canonicalize_packed_head_split),
    // norms without beta; its local layers' banded mask (64 positions) goes in as attention_bias.
    {"modernbert_torchscript", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}, {"SkipLayerNormalization", 4}}, "modernbert", true},
    {"modernbert_dynamo", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}, {"SkipLayerNormalization", 4}}, "modernbert", true},
};

// Fused attention blocks an export expects, of either operator.
int ExpectedAttention(const Export& e) {
  int count = 0;
  for (const char* op : {"Attention", "MultiHeadAttention", "GroupQueryAttention"}) {
    auto it = e.fused.find(op);
    if (it != e.fused.end()) count += it->second;
  }
  return count;
}

void PrintTo(const Export& e, std::ostream* os) { *os << e.name; }

class HfExportTest : public ::testing::TestWithParam<Export> {};

TEST_P(HfExportTest, AttentionFusesAndOutputsMatchOnPaddedBatches) {
  const Export& e = GetParam();
  auto original = LoadModel(testing::FixturePath(absl::StrCat("hf/", e.name, ".onnx")));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops;
  for (const auto& node : run.model.graph().node()) ++ops[node.op_type()];
  for (const auto& [op, count] : e.fused) EXPECT_EQ(ops[op], count) << op;
  for (const char* gone : {"IsNaN", "Erf"}) EXPECT_EQ(ops.count(gone), 0u) << gone;
  EXPECT_EQ(ops.count("Softmax") == 0 ? 0 : ops["Softmax"], 2 - ExpectedAttention(e)) << "every fused block's Softmax goes";
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "GroupQueryAttention") {  // causal by itself, the padding as attention_bias
      EXPECT_TRUE(e.causal) << node.name();
      bool rotates_inside = false;
      for (const auto& attribute : node.attribute()) rotates_inside |= attribute.name() == "do_rotary" && attribute.i() == 1;
      EXPECT_TRUE(rotates_inside) << "the rotation goes inside " << node.name();
      // Q, K and V packed into the query: one projection (or Phi-3's own packed one) for the three.
      EXPECT_TRUE(node.input(1).empty() && node.input(2).empty()) << "packed Q, K and V into " << node.name();
      EXPECT_EQ(node.input_size() > 10 && !node.input(10).empty(), e.has_mask) << "attention_bias of " << node.name();
    }
    if (node.op_type() == "MultiHeadAttention") {  // the mask as MHA's own masking, or as a bias
      const bool key_padding = node.input_size() > 4 && !node.input(4).empty();
      const bool biased = node.input_size() > 5 && !node.input(5).empty();
      EXPECT_EQ(key_padding || biased, e.has_mask) << "mask of " << node.name();
      bool unidirectional = false;
      for (const auto& attribute : node.attribute()) unidirectional |= attribute.name() == "unidirectional" && attribute.i() == 1;
      if (key_padding) EXPECT_EQ(unidirectional, e.causal) << "a causal mask becomes unidirectional attention";
    }
    if (node.op_type() != "Attention") continue;
    const bool biased = node.input_size() > 5 && !node.input(5).empty();
    EXPECT_EQ((node.input_size() > 3 && !node.input(3).empty()) || biased, e.has_mask) << "mask of " << node.name();
    EXPECT_EQ(biased, std::string(e.family) == "t5") << "T5's position bias is Attention's attention_bias";
    bool unidirectional = false;
    for (const auto& attribute : node.attribute()) unidirectional |= attribute.name() == "unidirectional" && attribute.i() == 1;
    EXPECT_EQ(unidirectional, FamilyKind(e.family) == "gpt2") << "a causal mask becomes unidirectional attention";
  }
  v1::TransformerReport report = JudgeTransformerFusion(*original, run.model, {}, ModelHints());
  EXPECT_EQ(report.family(), e.family);
  EXPECT_EQ(report.fused_kinds().at("Attention"), ExpectedAttention(e));
  EXPECT_TRUE(report.fully_fused()) << "what a user reads in the report: " << report.DebugString();

  v1::ParityReport parity;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 3, e.has_mask ? std::vector<int64_t>{16, e.max_length}
                                                                           : std::vector<int64_t>{}, &parity);
  EXPECT_GE(parity.outputs_size(), e.has_mask ? 4 : 2) << "every output compared for every sample and length";
  // The padding reaches the fused model.
  if (e.has_mask) testing::ExpectPaddingChangesTheOutput(run.model, *original);
}

INSTANTIATE_TEST_SUITE_P(Exports, HfExportTest, ::testing::ValuesIn(kExports),
                         [](const ::testing::TestParamInfo<Export>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace onnxopt
