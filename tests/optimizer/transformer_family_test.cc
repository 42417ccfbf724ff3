// Family detection on forms no fixture has (the fixtures' families are checked in hf_export_test), and
// the config naming any family detection knows.
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/transformer_report.h"
#include "tests/model_builder.h"
#include "tests/attention_graphs.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

// RMSNorm on the heads of Q and K beside rotary embeddings: Qwen3's (and Gemma 3's) q_norm / k_norm.
TEST(TransformerFamilyTest, HeadNormsWithRotaryReadAsQwen3) {
  testing::AttentionGraphOptions options;
  options.rotary = true;
  options.head_norm = true;
  EXPECT_EQ(DetectTransformer(testing::AttentionGraph(options)).family, "qwen3");
  // The norm over the whole projection (OLMo 2) is no head norm: a LLaMA-like decoder.
  options.head_norm = false;
  options.projection_norm = true;
  EXPECT_EQ(DetectTransformer(testing::AttentionGraph(options)).family, "llama");
}

// Older exports store the rotary tables (a Constant or an initializer gathered at the positions) and
// rotate with rotate_half's Neg: no Sin or Cos. With RMSNorm that is a LLaMA-like decoder (the
// older-spelling cache decoder), not GPT-2 (whose report would expect an EmbedLayerNormalization).
TEST(TransformerFamilyTest, StoredRotaryTablesReadAsRotary) {
  auto legacy = LoadModel(testing::FixturePath("cache/legacy_cache_decoder.onnx"));
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(FamilyKind(DetectTransformer(*legacy).family), "llama");
}

TEST(TransformerFamilyTest, EveryKnownFamilyHasAKindAndTheConfigTakesIt) {
  const onnx::ModelProto model = testing::AttentionGraph({});
  for (const auto& [family, kind] : KnownFamilies()) {
    EXPECT_EQ(FamilyKind(family), kind);
    EXPECT_EQ(FamilyKind(kind), kind) << "a kind is a family of its own";
    testing::PassRun run = testing::RunConfig(
        std::string(R"({"preset": "transformer", "transformer": {"family": ")") + family + R"("}})", model);
    EXPECT_TRUE(run.status.ok()) << family << ": " << run.status;
  }
  EXPECT_EQ(FamilyKind("mamba"), "");
}

}  // namespace
}  // namespace onnxopt
