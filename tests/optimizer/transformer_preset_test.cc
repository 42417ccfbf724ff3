// The transformer preset on every exported family (BERT, RoBERTa, GPT-2, ViT, a LLaMA-style RMSNorm
// block, a LLaMA/Mistral-style decoder with grouped-query attention) at every opset it was exported at: each fusion fires, the report calls the model fully
// fused for its family, and ONNX Runtime gives the same outputs within 1e-4 absolute, on inputs with
// padded masks at sequence 16 and 128.
#include <filesystem>
#include <map>
#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/parity.h"
#include "optimizer/transformer_report.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;

struct Family {
  const char* name;
  std::vector<int> opsets;
  std::map<std::string, int> fused;  // operator -> count in the optimized model
  std::string family;                // what detection must say ("" for no transformer)
};

const std::vector<Family>& Families() {
  static const auto* families = new std::vector<Family>{
      {"bert", {11, 14, 17}, {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "bert"},
      {"roberta", {11, 14, 17}, {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"BiasGelu", 2}}, "roberta"},
      {"gpt2", {11, 14, 17}, {{"Attention", 2}, {"SkipLayerNormalization", 4}, {"EmbedLayerNormalization", 1}, {"FastGelu", 2}}, "gpt2"},
      {"vit", {11, 14, 17}, {{"Attention", 2}, {"SkipLayerNormalization", 5}, {"BiasGelu", 2}}, "vit"},
      {"rmsnorm", {14, 17}, {{"SimplifiedLayerNormalization", 1}, {"SkipSimplifiedLayerNormalization", 1}, {"QuickGelu", 1}}, ""},
      // Rotary Q/K from a position_ids input (a cos/sin row per batch row), grouped-query K/V; its float
      // causal + padding mask, probed as an additive mask, is what GroupQueryAttention computes.
      {"llama_gqa", {14, 17}, {{"GroupQueryAttention", 2}, {"RotaryEmbedding", 4}, {"SkipSimplifiedLayerNormalization", 4}}, "llama"},
  };
  return *families;
}

std::vector<std::tuple<std::string, int>> Fixtures() {
  std::vector<std::tuple<std::string, int>> fixtures;
  for (const Family& family : Families()) {
    for (int opset : family.opsets) fixtures.emplace_back(family.name, opset);
  }
  return fixtures;
}

class TransformerFamilyTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

using testing::OpCounts;  // the same count; a second definition clashes in a unity batch with a file using this one

TEST_P(TransformerFamilyTest, EveryFusionFiresAndOutputsMatch) {
  const auto& [name, opset] = GetParam();
  const Family& family = *std::find_if(Families().begin(), Families().end(), [&](const Family& f) { return f.name == name; });
  auto original = LoadModel(testing::FixturePath(absl::StrCat("transformers/", name, "_opset", opset, ".onnx")));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  const auto ops = OpCounts(run.model);
  for (const auto& [op, count] : family.fused) {
    auto it = ops.find(op);
    EXPECT_EQ(it == ops.end() ? 0 : it->second, count) << op;
  }
  for (const char* gone : {"Softmax", "ReduceMean", "Erf", "Pow", "LayerNormalization"}) EXPECT_EQ(ops.count(gone), 0u) << gone;
  if (name == "gpt2") {
    for (const auto& node : run.model.graph().node()) {
      if (node.op_type() != "Attention") continue;
      bool unidirectional = false;
      for (const auto& attribute : node.attribute()) unidirectional |= attribute.name() == "unidirectional" && attribute.i() == 1;
      EXPECT_TRUE(unidirectional) << "GPT-2's causal mask becomes unidirectional attention";
    }
  }

  // The family verdict.
  std::vector<v1::PassReport> reports;
  v1::TransformerReport report = JudgeTransformerFusion(*original, run.model, reports, ModelHints());
  EXPECT_EQ(report.family(), family.family);
  if (!family.family.empty()) {
    EXPECT_EQ(report.layers(), 2);
    EXPECT_EQ(report.num_heads(), 4);
    EXPECT_EQ(report.hidden_size(), 64);
    EXPECT_TRUE(report.fully_fused()) << report.DebugString();
    for (const auto& [kind, expected] : report.expected_ops()) EXPECT_GE(report.fused_kinds().at(kind), expected) << kind;
  }

  // Numbers: both graphs as written (ONNX Runtime's own fusions off), padded masks, two lengths.
  v1::ParityReport parity;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, name == "vit" ? std::vector<int64_t>{}
                                                                              : std::vector<int64_t>{16, 128}, &parity);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformerFamilyTest, ::testing::ValuesIn(Fixtures()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
                           return absl::StrCat(std::get<0>(info.param), "_opset", std::get<1>(info.param));
                         });

// torch.jit exports mask[:, None, None, :] as two Unsqueezes: fuse_attention reads the chain itself,
// so the layers fuse in the first sweep rather than after fuse_reshape_chains merged it in a second.
TEST(TransformerMaskTest, AMaskUnsqueezedByAChainFusesWithoutReshapeChains) {
  const std::string cleanups = R"({"name": "eliminate_identity"}, {"name": "eliminate_noop_ops"},
      {"name": "fold_constants"}, {"name": "eliminate_common_subexpressions"}, {"name": "eliminate_dead_nodes"})";
  const std::string config = absl::StrCat(R"({"passes": [)", cleanups, ",", cleanups, R"(,
      {"name": "canonicalize_shape_reads"}, {"name": "unflatten_gemm"}, {"name": "fuse_attention"}]})");
  for (const char* fixture : {"transformers/bert_opset17.onnx", "transformers/gpt2_opset17.onnx"}) {
    auto original = LoadModel(testing::FixturePath(fixture));
    ASSERT_TRUE(original.ok()) << original.status();
    int chained = 0;  // an Unsqueeze reading an Unsqueeze: the chain this is about
    for (const auto& node : original->graph().node()) {
      if (node.op_type() != "Unsqueeze") continue;
      for (const auto& other : original->graph().node()) {
        chained += other.op_type() == "Unsqueeze" && !other.output().empty() && other.output(0) == node.input(0);
      }
    }
    ASSERT_GT(chained, 0) << fixture << " no longer has the chain";
    testing::PassRun run = testing::RunConfig(config, *original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(OpCounts(run.model)["Attention"], 2) << fixture;
    v1::ParityReport parity;
    testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {16}, &parity);
  }
}

// GPT-2's projections (Conv1D: a Gemm without transB) become MatMuls, and its packed Q/K/V the
// Attention's, with their weights as they are: weights kept in their file are not read. Only the
// projection weights stay in the data file (the causal mask buffer is read, to be recognized), and
// the file is emptied while the preset runs, so a read would fail and the fusion skip; it was a
// gigabyte read for nothing on a 1 GB decoder.
TEST(TransformerWeightsTest, ProjectionWeightsKeptInTheirFileAreNotRead) {
  auto original = LoadModel(testing::FixturePath("transformers/gpt2_opset17.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  const fs::path dir = testing::TempDir("weights_unread");
  SaveOptions external;
  external.external_threshold_bytes = 0;
  external.external_min_bytes = 16 << 10;
  ASSERT_TRUE(SaveModel(*original, dir / "model.onnx", external).ok());
  auto referenced = LoadModelByReference(dir / "model.onnx", 16 << 10);
  ASSERT_TRUE(referenced.ok()) << referenced.status();
  int kept_in_file = 0;
  for (auto& tensor : *referenced->mutable_graph()->mutable_initializer()) {
    const bool projection = absl::StrContains(tensor.name(), ".c_");
    if (!projection) {
      ASSERT_TRUE(LoadTensorBytes(&tensor).ok()) << tensor.name();
    }
    kept_in_file += projection && IsByReference(tensor);
  }
  ASSERT_EQ(kept_in_file, 8) << "four projection weights a layer, by reference";
  const fs::path data = dir / "model.onnx.data";
  fs::copy_file(data, dir / "kept.data");
  fs::resize_file(data, 0);
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *referenced);
  fs::copy_file(dir / "kept.data", data, fs::copy_options::overwrite_existing);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model)["Attention"], 2);
  EXPECT_TRUE(HasTensorsByReference(run.model));
  ASSERT_TRUE(LoadAllTensorBytes(&run.model).ok());
  v1::ParityReport parity;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {16}, &parity);
  fs::remove_all(dir);
}

// Sixteen layers: the shapes the fusions need reach the last layer (they stopped after about a dozen
// fused layers), so every layer fuses, and the outputs still match on padded masks.
TEST(TransformerDepthTest, EveryLayerOfADeepDecoderFuses) {
  auto original = LoadModel(testing::FixturePath("transformers/gpt2_deep16_opset17.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  const auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.at("Attention"), 16);
  EXPECT_EQ(ops.at("SkipLayerNormalization"), 32);
  EXPECT_EQ(ops.at("FastGelu"), 16);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  v1::TransformerReport report = JudgeTransformerFusion(*original, run.model, {}, ModelHints());
  EXPECT_EQ(report.layers(), 16);
  EXPECT_TRUE(report.fully_fused()) << report.DebugString();
  v1::ParityReport parity;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {16, 64}, &parity);
}

// Padded masks reach the fused Attention: a row with positions masked must differ from the same
// row unmasked, in the original and the optimized model alike (parity alone would pass if neither
// looked at the mask).
TEST(TransformerMaskTest, PaddingChangesTheOutputOfBothModels) {
  auto original = LoadModel(testing::FixturePath("transformers/bert_opset14.onnx"));
  ASSERT_TRUE(original.ok());
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok());
  for (const onnx::ModelProto* model : {&*original, &run.model}) testing::ExpectPaddingChangesTheOutput(*model, *original);
}

// The config's head count is what fuse_attention falls back to; a family that does not exist is
// refused before anything runs.
TEST(TransformerHintsTest, ConfigOverridesAndValidation) {
  auto original = LoadModel(testing::FixturePath("transformers/bert_opset14.onnx"));
  ASSERT_TRUE(original.ok());
  testing::PassRun bad = testing::RunConfig(R"({"preset": "transformer", "transformer": {"family": "mamba"}})", *original);
  EXPECT_EQ(bad.status.code(), absl::StatusCode::kInvalidArgument);
  testing::PassRun odd = testing::RunConfig(R"({"preset": "transformer", "transformer": {"numHeads": 5, "hiddenSize": 64}})",
                                            *original);
  EXPECT_EQ(odd.status.code(), absl::StatusCode::kInvalidArgument);
  ModelHints hints;
  hints.family = "gpt2";
  hints.num_heads = 8;
  v1::TransformerReport report = JudgeTransformerFusion(*original, *original, {}, hints);
  EXPECT_EQ(report.family(), "gpt2");
  EXPECT_EQ(report.family_source(), "config");
  EXPECT_EQ(report.num_heads(), 8);
  EXPECT_FALSE(report.fully_fused());
  ASSERT_GT(report.missing_size(), 0);
  EXPECT_NE(report.missing(0).find("not in this pipeline"), std::string::npos) << report.missing(0);
}

}  // namespace
}  // namespace onnxopt
