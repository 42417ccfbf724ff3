// The transformer preset on real Hugging Face transformers 5.17 exports (torch 2.11's TorchScript
// exporter at opset 17 and its dynamo exporter at opset 20; tests/fixtures/hf, made by export_hf.py): SDPA attention (sqrt-scale on Q and
// K^T, a boolean mask built by masking_utils, the IsNaN guard), eager attention (finfo.min mask),
// ViT's all-true mask, GPT-2's causal + padding mask and T5's position bias fuse into Attention, LLaMA's
// rotary attention into MultiHeadAttention, and ONNX Runtime gives the same outputs on padded batches.
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
    {"llama_torchscript", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}, {"SkipSimplifiedLayerNormalization", 4}}, "llama", true},
    {"llama_dynamo", {{"MultiHeadAttention", 2}, {"RotaryEmbedding", 4}, {"SkipSimplifiedLayerNormalization", 4}}, "llama", true},
    // Whisper's encoder scales Q before its head split (q_proj(x) * scaling), K has no bias and there is
    // no mask: the scale goes into Attention's. The report still calls the family vit.
    {"whisper_encoder_torchscript", {{"Attention", 2}, {"BiasGelu", 2}, {"SkipLayerNormalization", 5}}, "vit", false},
    {"whisper_encoder_dynamo", {{"Attention", 2}, {"BiasGelu", 2}, {"SkipLayerNormalization", 5}}, "vit", false},
};

// Fused attention blocks an export expects, of either operator.
int ExpectedAttention(const Export& e) {
  int count = 0;
  for (const char* op : {"Attention", "MultiHeadAttention"}) {
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
    if (node.op_type() == "MultiHeadAttention") {  // the causal + padding mask as MHA's own masking
      EXPECT_TRUE(node.input_size() > 4 && !node.input(4).empty()) << "key_padding_mask of " << node.name();
      bool unidirectional = false;
      for (const auto& attribute : node.attribute()) unidirectional |= attribute.name() == "unidirectional" && attribute.i() == 1;
      EXPECT_TRUE(unidirectional) << "LLaMA's causal mask becomes unidirectional attention";
    }
    if (node.op_type() != "Attention") continue;
    const bool biased = node.input_size() > 5 && !node.input(5).empty();
    EXPECT_EQ((node.input_size() > 3 && !node.input(3).empty()) || biased, e.has_mask) << "mask of " << node.name();
    EXPECT_EQ(biased, std::string(e.family) == "t5") << "T5's position bias is Attention's attention_bias";
    bool unidirectional = false;
    for (const auto& attribute : node.attribute()) unidirectional |= attribute.name() == "unidirectional" && attribute.i() == 1;
    EXPECT_EQ(unidirectional, std::string(e.family) == "gpt2") << "a causal mask becomes unidirectional attention";
  }
  v1::TransformerReport report = JudgeTransformerFusion(*original, run.model, {}, ModelHints());
  EXPECT_EQ(report.family(), e.family);
  EXPECT_EQ(report.fused_kinds().at("Attention"), ExpectedAttention(e));
  EXPECT_TRUE(report.fully_fused()) << "what a user reads in the report: " << report.DebugString();

  v1::ParityReport parity;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 3, e.has_mask ? std::vector<int64_t>{16, 128}
                                                                           : std::vector<int64_t>{}, &parity);
  EXPECT_GE(parity.outputs_size(), e.has_mask ? 4 : 2) << "every output compared for every sample and length";
  // The padding reaches the fused model.
  if (e.has_mask) testing::ExpectPaddingChangesTheOutput(run.model, *original);
}

INSTANTIATE_TEST_SUITE_P(Exports, HfExportTest, ::testing::ValuesIn(kExports),
                         [](const ::testing::TestParamInfo<Export>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace onnxopt
