// fuse_embed_layer_norm on the spellings other tools write: position ids given as a graph input (GPT-2
// exported with position_ids, BERT given all three ids), one ids input read by every lookup with the sum
// a graph output (ONNX Runtime's own GPT-2 embedding test graph), the same summed inside ONNX Runtime's
// SkipLayerNormalization, and older exports' token types of ConstantOfShape zeros. Each fuses and matches the original in ONNX Runtime.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::MakeNode;

constexpr int64_t kHidden = 16, kRows = 32, kSequence = 8;

onnx::ValueInfoProto Ids(const std::string& name) { return testing::MakeValue(name, onnx::TensorProto::INT64, {-1, kSequence}); }

// The tables (kRows rows each: generated ids stay in every table's range), gamma and beta, and
// LayerNormalization(sum) -> y [batch, kSequence, kHidden].
onnx::GraphProto Embeddings(const std::vector<std::string>& tables, const std::string& sum) {
  onnx::GraphProto graph;
  uint32_t seed = 11;
  for (const std::string& table : tables) {
    *graph.add_initializer() = testing::FloatTensor(table, {kRows, kHidden}, testing::RandomFloats(kRows * kHidden, seed++));
  }
  *graph.add_initializer() = testing::FloatTensor("gamma", {kHidden}, testing::RandomFloats(kHidden, 5));
  *graph.add_initializer() = testing::FloatTensor("beta", {kHidden}, testing::RandomFloats(kHidden, 6));
  *graph.add_output() = testing::FloatValue("y", {-1, kSequence, kHidden});
  *graph.add_node() = testing::WithIntAttribute(MakeNode("LayerNormalization", {sum, "gamma", "beta"}, {"y"}), "axis", -1);
  return graph;
}

std::map<std::string, int> Fuse(const onnx::ModelProto& model, onnx::ModelProto* fused) {
  testing::PassRun run = testing::RunConfig(R"({"passes": [{"name": "fuse_embed_layer_norm"}]})", model);
  EXPECT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1) << run.report.DebugString();
  *fused = run.model;
  return testing::OpCounts(run.model);
}

TEST(FuseEmbedLayerNormTest, PositionIdsGivenAsAnInput) {
  onnx::GraphProto graph = Embeddings({"wte", "wpe"}, "sum");
  *graph.add_input() = Ids("input_ids");
  *graph.add_input() = Ids("position_ids");
  *graph.add_node() = MakeNode("Gather", {"wte", "input_ids"}, {"w"});
  *graph.add_node() = MakeNode("Gather", {"wpe", "position_ids"}, {"p"});
  *graph.add_node() = MakeNode("Add", {"w", "p"}, {"sum"});
  const onnx::ModelProto original = testing::MakeModel(graph, 17);
  onnx::ModelProto fused;
  EXPECT_EQ(Fuse(original, &fused)["EmbedLayerNormalization"], 1);
  testing::ExpectSameOutputs(original, fused, 1e-5, 1e-4);
}

TEST(FuseEmbedLayerNormTest, EveryIdGivenAsAnInput) {
  onnx::GraphProto graph = Embeddings({"word", "type", "pos"}, "sum");
  for (const char* name : {"input_ids", "token_type_ids", "position_ids"}) *graph.add_input() = Ids(name);
  *graph.add_node() = MakeNode("Gather", {"word", "input_ids"}, {"w"});
  *graph.add_node() = MakeNode("Gather", {"type", "token_type_ids"}, {"t"});
  *graph.add_node() = MakeNode("Add", {"w", "t"}, {"wt"});
  *graph.add_node() = MakeNode("Gather", {"pos", "position_ids"}, {"p"});
  *graph.add_node() = MakeNode("Add", {"wt", "p"}, {"sum"});
  const onnx::ModelProto original = testing::MakeModel(graph, 17);
  onnx::ModelProto fused;
  EXPECT_EQ(Fuse(original, &fused)["EmbedLayerNormalization"], 1);
  testing::ExpectSameOutputs(original, fused, 1e-5, 1e-4);
}

// One int32 ids input read by all three lookups, the sum a graph output (becomes output 2).
TEST(FuseEmbedLayerNormTest, OneIdsInputForEveryLookupAndTheSumAnOutput) {
  onnx::GraphProto graph = Embeddings({"word", "pos", "token"}, "embedding_sum");
  *graph.add_input() = testing::MakeValue("ids", onnx::TensorProto::INT32, {-1, kSequence});
  *graph.add_node() = MakeNode("Gather", {"word", "ids"}, {"w"});
  *graph.add_node() = MakeNode("Gather", {"pos", "ids"}, {"p"});
  *graph.add_node() = MakeNode("Add", {"w", "p"}, {"a0"});
  *graph.add_node() = MakeNode("Gather", {"token", "ids"}, {"t"});
  *graph.add_node() = MakeNode("Add", {"a0", "t"}, {"embedding_sum"});
  *graph.add_output() = testing::FloatValue("embedding_sum", {-1, kSequence, kHidden});
  const onnx::ModelProto original = testing::MakeModel(graph, 17);
  onnx::ModelProto fused;
  EXPECT_EQ(Fuse(original, &fused)["EmbedLayerNormalization"], 1);
  for (const auto& node : fused.graph().node()) {
    if (node.op_type() == "EmbedLayerNormalization") EXPECT_EQ(node.output(2), "embedding_sum");
  }
  testing::ExpectSameOutputs(original, fused, 1e-5, 1e-4);
}

// As ONNX Runtime's optimizer leaves it: two lookups summed inside a SkipLayerNormalization, the sum its
// output 3 and a graph output (its GPT-2 embedding test graph).
TEST(FuseEmbedLayerNormTest, LookupsSummedInsideASkipLayerNormalization) {
  onnx::GraphProto graph = Embeddings({"word", "pos", "token"}, "unused_sum");
  graph.mutable_node()->Clear();  // the norm is ONNX Runtime's here
  *graph.add_input() = testing::MakeValue("ids", onnx::TensorProto::INT32, {-1, kSequence});
  *graph.add_node() = MakeNode("Gather", {"word", "ids"}, {"w"});
  *graph.add_node() = MakeNode("Gather", {"pos", "ids"}, {"p"});
  *graph.add_node() = MakeNode("Add", {"w", "p"}, {"a0"});
  *graph.add_node() = MakeNode("Gather", {"token", "ids"}, {"t"});
  onnx::NodeProto skip = MakeNode("SkipLayerNormalization", {"a0", "t", "gamma", "beta"}, {"y", "", "", "embedding_sum"});
  skip.set_domain("com.microsoft");
  onnx::AttributeProto* epsilon = skip.add_attribute();
  epsilon->set_name("epsilon");
  epsilon->set_type(onnx::AttributeProto::FLOAT);
  epsilon->set_f(1e-5f);
  *graph.add_node() = skip;
  *graph.add_output() = testing::FloatValue("embedding_sum", {-1, kSequence, kHidden});
  onnx::ModelProto original = testing::MakeModel(graph, 17);
  onnx::OperatorSetIdProto* contrib = original.add_opset_import();
  contrib->set_domain("com.microsoft");
  contrib->set_version(1);
  onnx::ModelProto fused;
  std::map<std::string, int> ops = Fuse(original, &fused);
  EXPECT_EQ(ops["EmbedLayerNormalization"], 1);
  EXPECT_EQ(ops.count("SkipLayerNormalization"), 0u);
  for (const auto& node : fused.graph().node()) {
    if (node.op_type() == "EmbedLayerNormalization") EXPECT_EQ(node.output(2), "embedding_sum");
  }
  testing::ExpectSameOutputs(original, fused, 1e-5, 1e-4);
}

// token_type_ids = ConstantOfShape(Shape(input_ids), 0), positions Unsqueeze(Range(0, S, 1)).
TEST(FuseEmbedLayerNormTest, TokenTypesOfConstantOfShapeZeros) {
  onnx::GraphProto graph = Embeddings({"word", "type", "pos"}, "sum");
  *graph.add_input() = Ids("input_ids");
  onnx::TensorProto zero = MakeRawTensor("value", onnx::TensorProto::INT64, {1}, std::string(8, '\0'));
  onnx::NodeProto fill = MakeNode("ConstantOfShape", {"shape"}, {"token_type_ids"});
  onnx::AttributeProto* value = fill.add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  *value->mutable_t() = zero;
  *graph.add_node() = MakeNode("Shape", {"input_ids"}, {"shape"});
  *graph.add_node() = fill;
  for (const auto& [name, v] : std::vector<std::pair<std::string, int64_t>>{{"zero", 0}, {"one", 1}}) {
    *graph.add_initializer() = MakeRawTensor(name, onnx::TensorProto::INT64, {}, std::string(reinterpret_cast<const char*>(&v), 8));
  }
  *graph.add_initializer() = MakeRawTensor("axis0", onnx::TensorProto::INT64, {1}, std::string(8, '\0'));
  *graph.add_node() = testing::WithIntAttribute(MakeNode("Gather", {"shape", "one"}, {"length"}), "axis", 0);
  *graph.add_node() = MakeNode("Range", {"zero", "length", "one"}, {"counting"});
  *graph.add_node() = MakeNode("Unsqueeze", {"counting", "axis0"}, {"position_ids"});
  *graph.add_node() = MakeNode("Gather", {"word", "input_ids"}, {"w"});
  *graph.add_node() = MakeNode("Gather", {"type", "token_type_ids"}, {"t"});
  *graph.add_node() = MakeNode("Gather", {"pos", "position_ids"}, {"p"});
  *graph.add_node() = MakeNode("Add", {"w", "t"}, {"wt"});
  *graph.add_node() = MakeNode("Add", {"wt", "p"}, {"sum"});
  const onnx::ModelProto original = testing::MakeModel(graph, 17);
  onnx::ModelProto fused;
  std::map<std::string, int> ops = Fuse(original, &fused);
  EXPECT_EQ(ops["EmbedLayerNormalization"], 1);
  EXPECT_EQ(ops["Gather"], 1) << "only the shape read is left";
  testing::ExpectSameOutputs(original, fused, 1e-5, 1e-4);
}

}  // namespace
}  // namespace onnxopt
