// fuse_rotary_embedding: the rotate-half rotation of Q and K becomes RotaryEmbedding, its caches and
// position ids made once for all the layers that share the tables, and the model computes the same
// outputs; fuse_attention then reads the rotated heads (MultiHeadAttention) and keeps them exact.
#include <cmath>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/fusion/rotary.h"
#include "optimizer/shape_info.h"
#include "tests/attention_graphs.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::AttentionGraph;
using testing::AttentionGraphOptions;
using testing::ExpectSameOutputs;
using testing::OpCounts;
using testing::RunConfig;

int CountInitializers(const onnx::ModelProto& model, const std::string& prefix) {
  int count = 0;
  for (const auto& tensor : model.graph().initializer()) count += absl::StartsWith(tensor.name(), prefix);
  return count;
}

TEST(FuseRotaryEmbeddingTest, RotationsBecomeRotaryEmbeddingAndStayExact) {
  AttentionGraphOptions options;
  options.rotary = true;
  const onnx::ModelProto original = AttentionGraph(options);
  testing::PassRun run = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "eliminate_dead_nodes"}]})",
                                   original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops["RotaryEmbedding"], 2) << "Q and K";
  EXPECT_EQ(ops.count("Neg"), 0u) << "both rotate_halfs went";
  EXPECT_EQ(ops["Reshape"], 4 + 2) << "the head splits and the merge, and the two caches as rows";
  EXPECT_EQ(CountInitializers(run.model, "rotary_zero"), 1) << "one offset for both rotations";
  // cos/sin of Concat(f, f): the caches are cos(f) and sin(f) themselves, no Concat and no Slice.
  EXPECT_EQ(ops.count("Concat"), 0u);
  EXPECT_EQ(ops.count("Slice"), 0u);
  EXPECT_EQ(ops["Cos"], 1);
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

// Tables stored in the model (cos_cached[:S][position_ids]): the caches are their first halves,
// the position ids the Gather's, and the model keeps its outputs; the attention fusion takes them.
TEST(FuseRotaryEmbeddingTest, StoredTablesBecomeTheCaches) {
  AttentionGraphOptions options;
  options.rotary = true;
  options.stored_tables = true;
  const onnx::ModelProto original = AttentionGraph(options);
  testing::PassRun run = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "eliminate_dead_nodes"}]})",
                                   original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops["RotaryEmbedding"], 2);
  EXPECT_EQ(ops.count("Gather"), 0u) << "the tables are read by the fused rotation itself";
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "RotaryEmbedding") EXPECT_EQ(node.input(1), "position_ids");
  }
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
  options.padding_mask = true;
  const onnx::ModelProto masked = AttentionGraph(options);
  testing::PassRun fused = RunConfig(R"({"preset": "transformer"})", masked);
  ASSERT_TRUE(fused.status.ok()) << fused.status;
  EXPECT_EQ(OpCounts(fused.model)["MultiHeadAttention"], 1);
  ExpectSameOutputs(masked, fused.model, 1e-5, 1e-5);
}

// A table read from a Constant node (torch 1.13 writes a buffer so when its data goes to an external
// file: a 4096-position table of head size 128 in a 4.5 GB decoder): the walk to what the table is made
// of stops at the Constant, whose values tell. It once read the Constant's missing input and aborted the job.
TEST(FuseRotaryEmbeddingTest, ATableInAConstantNodeIsReadNotWalkedThrough) {
  constexpr int64_t kPositions = 4, kWidth = 4;
  std::vector<float> halves;
  for (int64_t p = 0; p < kPositions; ++p) {
    for (int copy = 0; copy < 2; ++copy) {
      for (int64_t i = 0; i < kWidth / 2; ++i) halves.push_back(std::cos(0.5f * static_cast<float>(p * (i + 1))));
    }
  }
  for (const bool repeats : {true, false}) {
    std::vector<float> values = halves;
    if (!repeats) values[1] += 1.0f;
    onnx::GraphProto proto;
    *proto.add_input() = testing::MakeValue("position_ids", onnx::TensorProto::INT64, {1, 2});
    onnx::NodeProto constant = testing::MakeNode("Constant", {}, {"cos_cached"});
    onnx::AttributeProto& value = *constant.add_attribute();
    value.set_name("value");
    value.set_type(onnx::AttributeProto::TENSOR);
    *value.mutable_t() = testing::FloatTensor("", {kPositions, kWidth}, values);
    *proto.add_node() = std::move(constant);
    *proto.add_node() = testing::MakeNode("Gather", {"cos_cached", "position_ids"}, {"cos"});
    *proto.add_output() = testing::FloatValue("cos", {1, 2, kWidth});
    const onnx::ModelProto model = testing::MakeModel(proto, 17);
    const ShapeInfo shapes = ShapeInfo::Infer(model);
    onnx::GraphProto copy = model.graph();
    Graph graph(&copy);
    EXPECT_EQ(IsDuplicatedHalfTable(graph, shapes, "cos", "Cos"), repeats);
  }
}

// The rotary form of Hugging Face's decoders, exported: every layer's rotations share one pair of
// caches, and the model keeps its outputs. Made once per table pair even where positions come per
// row (the Range form): the rewrite once added its constants twice there.
TEST(FuseRotaryEmbeddingTest, EveryLayerOfAnExportSharesOneCacheAndOneOffset) {
  for (const char* name : {"hf/llama_torchscript.onnx", "hf/llama_dynamo.onnx"}) {
    auto original = LoadModel(testing::FixturePath(name));
    ASSERT_TRUE(original.ok()) << original.status();
    testing::PassRun cleaned = RunConfig(R"({"preset": "basic"})", *original);
    ASSERT_TRUE(cleaned.status.ok());
    testing::PassRun run = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}]})", cleaned.model);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.report.rewrites(), 4) << name << ": Q and K of two layers";
    EXPECT_EQ(OpCounts(run.model)["RotaryEmbedding"], 4) << name;
    for (const char* constant : {"rotary_zero", "rotary_axis", "rotary_half"}) {
      EXPECT_EQ(CountInitializers(run.model, constant), 1) << name << ": " << constant;
    }
    v1::ParityReport parity;
    testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {16}, &parity);
  }
}

// The positions built once for every layer read B and S from the first layer's Q heads; the transformer
// preset's second canonicalize_shape_reads moves that read to the graph input the heads are computed from
// (input_ids), so layer 0's Q is not kept alive outside its attention (which then fused only over the
// heads as the graph computes them while the other layers fused whole).
TEST(FuseRotaryEmbeddingTest, ThePositionsReadTheBatchAndLengthFromAnInput) {
  auto original = LoadModel(testing::FixturePath("transformers/llama_gqa_opset17.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  testing::PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  for (const auto& report : run.reports) {
    if (report.name() == "fuse_attention") EXPECT_EQ(report.counters().count("fused_over_given_heads"), 0u);
  }
  std::map<std::string, const onnx::NodeProto*> producers;
  for (const auto& node : run.model.graph().node()) {
    for (const auto& output : node.output()) producers[output] = &node;
  }
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "Shape") continue;
    auto producer = producers.find(node.input(0));
    EXPECT_TRUE(producer == producers.end() || producer->second->op_type() != "Transpose")
        << "a Shape of heads: " << node.input(0);
  }
  v1::ParityReport parity;
  testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {16}, &parity);
}

// The fused rotations are what the attention fusion reads next: MultiHeadAttention with the rotation
// moved onto the [B,S,H] projections, the same outputs.
TEST(FuseRotaryEmbeddingTest, TheAttentionFusionTakesTheFusedRotations) {
  AttentionGraphOptions options;
  options.rotary = true;
  options.padding_mask = true;
  const onnx::ModelProto original = AttentionGraph(options);
  testing::PassRun run = RunConfig(R"({"preset": "transformer"})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops["MultiHeadAttention"], 1);
  EXPECT_EQ(ops["RotaryEmbedding"], 2);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "RotaryEmbedding") continue;
    bool num_heads = false;
    for (const auto& attribute : node.attribute()) num_heads |= attribute.name() == "num_heads" && attribute.i() == 2;
    EXPECT_TRUE(num_heads) << "rotating [B,S,H] needs the heads";
  }
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

// GPT-J's interleaved rotation (pairs (x[2i], x[2i+1]) rotate; tables repeat each value twice in a row)
// becomes RotaryEmbedding with interleaved=1 reading the tables' even elements, alone and inside the
// fused attention (grouped K/V and a padding mask too), and every model keeps its outputs.
TEST(FuseRotaryEmbeddingTest, AnInterleavedRotationBecomesAnInterleavedRotaryEmbedding) {
  AttentionGraphOptions options;
  options.rotary = true;
  options.interleaved = true;
  const onnx::ModelProto original = AttentionGraph(options);
  testing::PassRun run = RunConfig(R"({"passes": [{"name": "fuse_rotary_embedding"}, {"name": "eliminate_dead_nodes"}]})",
                                   original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model)["RotaryEmbedding"], 2) << "Q and K";
  EXPECT_EQ(OpCounts(run.model).count("Neg"), 0u);
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);

  options.grouped = true;
  options.padding_mask = true;
  const onnx::ModelProto grouped = AttentionGraph(options);
  run = RunConfig(R"({"preset": "transformer"})", grouped);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops["GroupQueryAttention"] + ops["MultiHeadAttention"], 1);
  EXPECT_EQ(ops["RotaryEmbedding"], 2);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "RotaryEmbedding") continue;
    bool interleaved = false;
    for (const auto& attribute : node.attribute()) interleaved |= attribute.name() == "interleaved" && attribute.i() == 1;
    EXPECT_TRUE(interleaved) << node.name();
  }
  ExpectSameOutputs(grouped, run.model, 1e-5, 1e-5);
}

// Interleaved tables that nothing proves to repeat their values (fed as inputs) stay element-wise:
// the attention fusion rotates pairs itself around the operator, and the outputs stay the same.
TEST(FuseRotaryEmbeddingTest, AnInterleavedRotationOverUnprovenTablesStaysElementWiseAroundTheAttention) {
  AttentionGraphOptions options;
  options.rotary = true;
  options.interleaved = true;
  options.table_inputs = true;
  const onnx::ModelProto original = AttentionGraph(options);
  testing::PassRun run = RunConfig(R"({"preset": "transformer"})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::map<std::string, int> ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("RotaryEmbedding"), 0u);
  EXPECT_EQ(ops["MultiHeadAttention"], 1);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  for (const auto& report : run.reports) {
    if (report.name() == "fuse_attention") {
      EXPECT_EQ(report.counters().count("fused_over_given_heads"), 0u) << "the rotation is the fusion's own";
    }
  }
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace
}  // namespace onnxopt
