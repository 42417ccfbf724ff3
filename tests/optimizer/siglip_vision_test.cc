// A SigLIP-style vision tower (tests/fixtures/siglip/vision{,_masked}.onnx, made by
// tests/fixtures/make_siglip_vision.py): Conv patches, eager attention scaled after Q*K^T, GELU (tanh),
// the multihead-attention pooling head; masked, SigLIP 2's NaFlex pixel_attention_mask expanded to a
// [B, 1, P, P] additive mask. Every encoder layer fuses, with and without the mask, and the outputs match
// on padded masks. The pooling head (torch.nn.MultiheadAttention, batch_first, a probe query over the
// patches: cross-attention on sequence-first heads) stays unfused.
#include <string>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

class SiglipVisionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SiglipVisionTest, EveryEncoderLayerFusesAndTheOutputsMatch) {
  auto original = LoadModel(testing::FixturePath("siglip/vision" + GetParam() + ".onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = testing::OpCounts(run.model);
  constexpr int kEncoderLayers = 2;
  EXPECT_EQ(ops["Attention"] + ops["MultiHeadAttention"], kEncoderLayers);
  EXPECT_EQ(ops["Softmax"], 1) << "the pooling head's";
  EXPECT_GE(ops["FastGelu"] + ops["Gelu"] + ops["BiasGelu"], kEncoderLayers);
  v1::ParityReport report;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 3, {}, &report);
}

INSTANTIATE_TEST_SUITE_P(Masks, SiglipVisionTest, ::testing::Values("", "_masked"),
                         [](const auto& info) { return info.param.empty() ? std::string("None") : std::string("NaFlex"); });

}  // namespace
}  // namespace onnxopt
