// remove_padding on fused encoders: the token-wise blocks run on the valid tokens, the outputs match
// the padded model on every valid position (judged by a job on the mask's valid positions), and
// models it does not fit are left alone with the reason.
#include <filesystem>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

// The Hugging Face BERT export through the transformer preset: EmbedLayerNormalization, then two
// layers of Attention (raw [B, S] mask), SkipLayerNormalization and MatMul -> BiasGelu -> MatMul.
onnx::ModelProto FusedBert() {
  auto exported = LoadModel(testing::FixturePath("hf/bert_torchscript.onnx"));
  EXPECT_TRUE(exported.ok());
  testing::PassRun fused = testing::RunConfig(R"({"preset": "transformer"})", *exported);
  EXPECT_TRUE(fused.status.ok()) << fused.status;
  return fused.model;
}

TEST(RemovePaddingTest, PacksEveryLayerAndMatchesOnValidPositions) {
  const onnx::ModelProto fused = FusedBert();
  testing::PassRun packed = testing::RunPass("remove_padding", fused);
  EXPECT_EQ(packed.report.rewrites(), 2) << "both layers";
  auto ops = testing::OpCounts(packed.model);
  EXPECT_EQ(ops["NonZero"], 1);
  EXPECT_EQ(ops["ScatterND"], 3) << "before each Attention and after the last layer";
  EXPECT_EQ(ops["Gather"], 3) << "the embedding and each Attention output";

  // Through a job: batch 8, half the positions padding at most, judged where the mask is 1.
  const auto dir = testing::TempDir("remove_padding_job");
  ASSERT_TRUE(SaveModel(fused, dir / "fused.onnx").ok());
  OptimizeRequest request;
  request.model_path = dir / "fused.onnx";
  request.output_dir = dir / "out";
  request.config.add_passes()->set_name("remove_padding");
  (*request.config.mutable_validation()->mutable_dim_values())["batch"] = 8;
  (*request.config.mutable_validation()->mutable_dim_values())["sequence"] = 64;
  request.config.mutable_validation()->set_mask_padding(0.5);
  request.config.mutable_benchmark()->set_skip(true);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::ParityReport& parity = result->report.parity();
  EXPECT_TRUE(parity.passed());
  EXPECT_EQ(parity.valid_positions_of(), "attention_mask");
  ASSERT_GT(parity.outputs_size(), 0);
  EXPECT_LT(parity.outputs(0).max_abs_error(), 1e-4);
}

// Every node's inputs are produced before it (or are graph inputs and initializers).
bool TopologicallyOrdered(const onnx::ModelProto& model) {
  std::set<std::string> known;
  for (const auto& input : model.graph().input()) known.insert(input.name());
  for (const auto& initializer : model.graph().initializer()) known.insert(initializer.name());
  for (const auto& node : model.graph().node()) {
    for (const auto& input : node.input()) {
      if (!input.empty() && known.count(input) == 0) return false;
    }
    for (const auto& output : node.output()) known.insert(output);
  }
  return true;
}

const onnx::NodeProto* OnlyNode(const onnx::ModelProto& model, const std::string& op) {
  const onnx::NodeProto* found = nullptr;
  for (const auto& node : model.graph().node()) {
    if (node.op_type() != op) continue;
    if (found != nullptr) return nullptr;
    found = &node;
  }
  return found;
}

// CUDA's form: RemovePadding after the embedding, PackedAttention on the packed tokens, RestorePadding
// after the last layer. Its kernels are CUDA's alone, so on the CPU the structure is what is checked;
// gpu_test runs it.
TEST(RemovePaddingTest, ThePackedFormRunsEveryLayerOnThePackedTokens) {
  const onnx::ModelProto fused = FusedBert();
  testing::PassRun packed = testing::RunConfig(
      R"({"passes": [{"name": "remove_padding", "params": {"form": "packed", "right_padding": true}}]})", fused);
  ASSERT_TRUE(packed.status.ok()) << packed.status;
  EXPECT_EQ(packed.report.rewrites(), 2);
  EXPECT_EQ(packed.report.counters().at("packed_layers"), 2);
  auto ops = testing::OpCounts(packed.model);
  EXPECT_EQ(ops["RemovePadding"], 1);
  EXPECT_EQ(ops["PackedAttention"], 2);
  EXPECT_EQ(ops["RestorePadding"], 1);
  EXPECT_EQ(ops["Attention"], 0);
  EXPECT_EQ(ops["NonZero"] + ops["ScatterND"], 0) << "no gather form beside it";
  EXPECT_EQ(ops["ReduceSum"], 1) << "the raw mask's token counts";
  EXPECT_TRUE(TopologicallyOrdered(packed.model));
  const onnx::NodeProto* remove = OnlyNode(packed.model, "RemovePadding");
  const onnx::NodeProto* restore = OnlyNode(packed.model, "RestorePadding");
  ASSERT_NE(remove, nullptr);
  ASSERT_NE(restore, nullptr);
  EXPECT_EQ(restore->input(1), remove->output(1)) << "token offsets";
  int64_t fused_heads = 0;
  for (const auto& node : fused.graph().node()) {
    for (const auto& attribute : node.attribute()) {
      if (node.op_type() == "Attention" && attribute.name() == "num_heads") fused_heads = attribute.i();
    }
  }
  ASSERT_GT(fused_heads, 0);
  for (const auto& node : packed.model.graph().node()) {
    if (node.op_type() != "PackedAttention") continue;
    ASSERT_EQ(node.input_size(), 5);
    EXPECT_EQ(node.input(3), remove->output(1));
    EXPECT_EQ(node.input(4), remove->output(2)) << "cumulative sequence lengths";
    bool heads = false;
    for (const auto& attribute : node.attribute()) heads |= attribute.name() == "num_heads" && attribute.i() == fused_heads;
    EXPECT_TRUE(heads) << "the Attention's head count, " << fused_heads << ": " << node.DebugString();
  }
  // The encoder's output keeps its name, restored to [B, S, H].
  bool output_restored = false;
  for (const auto& output : fused.graph().output()) output_restored |= output.name() == restore->output(0);
  for (const auto& node : fused.graph().node()) {
    for (const auto& input : node.input()) output_restored |= input == restore->output(0);
  }
  EXPECT_TRUE(output_restored);
}

TEST(RemovePaddingTest, ARawMaskIsPackedOnlyWhereCallersPadOnTheRight) {
  const onnx::ModelProto fused = FusedBert();
  testing::PassRun run =
      testing::RunConfig(R"({"passes": [{"name": "remove_padding", "params": {"form": "packed"}}]})", fused);
  ASSERT_TRUE(run.status.ok());
  auto ops = testing::OpCounts(run.model);
  EXPECT_EQ(ops["PackedAttention"], 0);
  EXPECT_EQ(ops["NonZero"], 1) << "the gather form instead";
  ASSERT_GT(run.report.notes_size(), 0);
  EXPECT_NE(run.report.notes(0).find("packed form refused"), std::string::npos) << run.report.notes(0);
}

TEST(RemovePaddingTest, AutoPacksWhereTheJobRunsOnCuda) {
  const onnx::ModelProto fused = FusedBert();
  const std::string pass = R"("passes": [{"name": "remove_padding", "params": {"right_padding": true}}])";
  testing::PassRun cuda = testing::RunConfig(R"({"benchmark": {"device": "DEVICE_CUDA"}, )" + pass + "}", fused);
  ASSERT_TRUE(cuda.status.ok());
  EXPECT_EQ(testing::OpCounts(cuda.model)["PackedAttention"], 2);
  testing::PassRun cpu = testing::RunConfig("{" + pass + "}", fused);
  ASSERT_TRUE(cpu.status.ok());
  EXPECT_EQ(testing::OpCounts(cpu.model)["PackedAttention"], 0);
  EXPECT_EQ(testing::OpCounts(cpu.model)["NonZero"], 1);
}

TEST(RemovePaddingTest, AnUnfusedEncoderIsLeftAlone) {
  auto exported = LoadModel(testing::FixturePath("hf/bert_torchscript.onnx"));
  ASSERT_TRUE(exported.ok());
  testing::PassRun run = testing::RunPass("remove_padding", *exported);
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::OpCounts(run.model)["NonZero"], 0);
}

}  // namespace
}  // namespace onnxopt
