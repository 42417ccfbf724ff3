// canonicalize_masked_scores: scores masked by selection before a Softmax become the additive boolean
// mask the attention fusion reads, computing the same in ONNX Runtime; other Wheres stay.
#include <limits>

#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::MakeValue;
using testing::OpCounts;
using testing::PassRun;
using testing::RunPass;
using testing::WithIntAttribute;

enum class Form { kMaskedFill, kWhereAllowed, kNotBeforeSoftmax, kSmallFill, kCausalBuffer };

// probs = Softmax(select(q k^T)) with q [2,2,4,8], k^T [2,2,8,4] and a boolean condition [2,1,4,4] (an input,
// or for kCausalBuffer a constant lower triangle [1,1,4,4]); kMaskedFill: Where(c, fill, s),
// kWhereAllowed and kCausalBuffer: Where(c, s, fill), kNotBeforeSoftmax: Where(c, fill, s) as the output,
// kSmallFill: fill -1.
onnx::ModelProto MaskedScores(Form form) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("q", {2, 2, 4, 8});
  *graph.add_input() = FloatValue("kt", {2, 2, 8, 4});
  const float fill = form == Form::kSmallFill ? -1.0f : std::numeric_limits<float>::lowest();
  *graph.add_initializer() = MakeFloatTensor("fill", {}, {fill});
  if (form == Form::kCausalBuffer) {
    std::vector<float> triangle(16);
    for (int q = 0; q < 4; ++q) {
      for (int t = 0; t < 4; ++t) triangle[static_cast<size_t>(q * 4 + t)] = t <= q ? 1.0f : 0.0f;
    }
    *graph.add_initializer() = MakeFloatTensor("buffer", {1, 1, 4, 4}, triangle);
    *graph.add_initializer() = MakeInt64Tensor("zero", {0});
    *graph.add_initializer() = MakeInt64Tensor("four", {4});
    *graph.add_initializer() = MakeInt64Tensor("axis", {3});
    *graph.add_node() = MakeNode("Slice", {"buffer", "zero", "four", "axis"}, {"sliced"});
    *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"sliced"}, {"c"}), "to", onnx::TensorProto::BOOL);
  } else {
    *graph.add_input() = MakeValue("c", onnx::TensorProto::BOOL, {2, 1, 4, 4});
  }
  *graph.add_node() = MakeNode("MatMul", {"q", "kt"}, {"scores"});
  const bool fill_first = form == Form::kMaskedFill || form == Form::kNotBeforeSoftmax || form == Form::kSmallFill;
  *graph.add_node() = MakeNode("Where", fill_first ? std::vector<std::string>{"c", "fill", "scores"}
                                                   : std::vector<std::string>{"c", "scores", "fill"},
                               {"masked"});
  if (form == Form::kNotBeforeSoftmax) {
    *graph.add_output() = FloatValue("masked", {2, 2, 4, 4});
  } else {
    *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"masked"}, {"probs"}), "axis", -1);
    *graph.add_output() = FloatValue("probs", {2, 2, 4, 4});
  }
  return MakeModel(graph, 17);
}

TEST(CanonicalizeMaskedScoresTest, MaskedFillBecomesAnAdditiveMaskOfTheAllowedPositions) {
  const onnx::ModelProto original = MaskedScores(Form::kMaskedFill);
  PassRun run = RunPass("canonicalize_masked_scores", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Not"], 1);
  EXPECT_EQ(ops["Add"], 1);
  EXPECT_EQ(ops["Where"], 1);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Add") {
      EXPECT_EQ(node.output(0), "masked") << "the Softmax reads the same value";
    }
  }
  ExpectSameOutputs(original, run.model, 0, 0);
}

TEST(CanonicalizeMaskedScoresTest, WhereAllowedScoresElseMinimumBecomesAnAdditiveMask) {
  const onnx::ModelProto original = MaskedScores(Form::kWhereAllowed);
  PassRun run = RunPass("canonicalize_masked_scores", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("Not"), 0u);
  EXPECT_EQ(ops["Add"], 1);
  ExpectSameOutputs(original, run.model, 0, 0);
}

TEST(CanonicalizeMaskedScoresTest, OtherSelectionsStay) {
  for (Form form : {Form::kNotBeforeSoftmax, Form::kSmallFill, Form::kCausalBuffer}) {
    PassRun run = RunPass("canonicalize_masked_scores", MaskedScores(form));
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.report.rewrites(), 0) << static_cast<int>(form);
  }
}

// GPT-2's first release and Megatron: scores * m - 10000 * (1 - m) over a 0/1 float mask m (here a boolean
// input or'ed with the diagonal, so no row is masked entirely, then cast to float).
TEST(CanonicalizeMaskedScoresTest, AMultipliedMaskBecomesAnAdditiveMask) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("q", {2, 2, 4, 8});
  *graph.add_input() = FloatValue("kt", {2, 2, 8, 4});
  *graph.add_input() = MakeValue("c", onnx::TensorProto::BOOL, {2, 1, 4, 4});
  onnx::TensorProto diagonal = MakeRawTensor("diagonal", onnx::TensorProto::BOOL, {4, 4}, std::string(16, '\0'));
  for (int i = 0; i < 4; ++i) (*diagonal.mutable_raw_data())[i * 5] = 1;
  *graph.add_initializer() = diagonal;
  *graph.add_initializer() = MakeFloatTensor("one", {}, {1.0f});
  *graph.add_initializer() = MakeFloatTensor("ten_thousand", {}, {10000.0f});
  *graph.add_node() = MakeNode("Or", {"c", "diagonal"}, {"allowed"});
  *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"allowed"}, {"m"}), "to", onnx::TensorProto::FLOAT);
  *graph.add_node() = MakeNode("MatMul", {"q", "kt"}, {"scores"});
  *graph.add_node() = MakeNode("Mul", {"scores", "m"}, {"kept"});
  *graph.add_node() = MakeNode("Sub", {"one", "m"}, {"inverted"});
  *graph.add_node() = MakeNode("Mul", {"ten_thousand", "inverted"}, {"penalty"});
  *graph.add_node() = MakeNode("Sub", {"kept", "penalty"}, {"masked"});
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"masked"}, {"probs"}), "axis", -1);
  *graph.add_output() = FloatValue("probs", {2, 2, 4, 4});
  const onnx::ModelProto original = MakeModel(graph, 17);
  PassRun run = testing::RunConfig(
      R"({"passes": [{"name": "canonicalize_masked_scores"}, {"name": "eliminate_dead_nodes"}]})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("Sub"), 0u);
  EXPECT_EQ(ops["Where"], 1);
  EXPECT_EQ(ops["Add"], 1);
  ExpectSameOutputs(original, run.model, 1e-7, 0);
}

// transformers 2.x's GPT-2: w * b - 10000 * (1 - b) over a float buffer b sliced to the scores, then the
// padding added: the selection Where(Cast(b, bool), w, -10000) the fusion reads as a causal mask, exact.
// A buffer holding another value than 0 and 1 is no selection: it keeps the additive rewrite's form only
// where nothing follows the product, and here (a padding Add after it) stays as it is.
onnx::ModelProto MultipliedBufferScores(float entry) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("q", {2, 2, 4, 8});
  *graph.add_input() = FloatValue("kt", {2, 2, 8, 4});
  *graph.add_input() = FloatValue("padding", {2, 1, 1, 4});
  std::vector<float> triangle(64);
  for (int q = 0; q < 8; ++q) {
    for (int t = 0; t < 8; ++t) triangle[static_cast<size_t>(q * 8 + t)] = t <= q ? 1.0f : 0.0f;
  }
  triangle[9] = entry;  // row 1, column 1
  *graph.add_initializer() = MakeFloatTensor("buffer", {1, 1, 8, 8}, triangle);
  *graph.add_initializer() = MakeInt64Tensor("zero", {0, 0});
  *graph.add_initializer() = MakeInt64Tensor("four", {4, 4});
  *graph.add_initializer() = MakeInt64Tensor("axes", {2, 3});
  *graph.add_initializer() = MakeFloatTensor("one", {}, {1.0f});
  *graph.add_initializer() = MakeFloatTensor("ten_thousand", {}, {10000.0f});
  *graph.add_node() = MakeNode("Slice", {"buffer", "zero", "four", "axes"}, {"b"});
  *graph.add_node() = MakeNode("MatMul", {"q", "kt"}, {"scores"});
  *graph.add_node() = MakeNode("Mul", {"scores", "b"}, {"kept"});
  *graph.add_node() = MakeNode("Sub", {"one", "b"}, {"inverted"});
  *graph.add_node() = MakeNode("Mul", {"ten_thousand", "inverted"}, {"penalty"});
  *graph.add_node() = MakeNode("Sub", {"kept", "penalty"}, {"masked"});
  *graph.add_node() = MakeNode("Add", {"masked", "padding"}, {"padded"});
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"padded"}, {"probs"}), "axis", -1);
  *graph.add_output() = FloatValue("probs", {2, 2, 4, 4});
  return MakeModel(graph, 17);
}

TEST(CanonicalizeMaskedScoresTest, AMultipliedCausalBufferBecomesTheSelection) {
  const onnx::ModelProto original = MultipliedBufferScores(1.0f);
  const char* config = R"({"passes": [{"name": "canonicalize_masked_scores"}, {"name": "eliminate_dead_nodes"}]})";
  PassRun run = testing::RunConfig(config, original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("Sub"), 0u);
  EXPECT_EQ(ops.count("Mul"), 0u);
  EXPECT_EQ(ops["Where"], 1);
  EXPECT_EQ(ops["Add"], 1) << "the padding's";
  ExpectSameOutputs(original, run.model, 0, 0);

  const onnx::ModelProto halves = MultipliedBufferScores(0.5f);
  PassRun kept = testing::RunConfig(config, halves);
  ASSERT_TRUE(kept.status.ok()) << kept.status;
  EXPECT_EQ(OpCounts(kept.model).count("Where"), 0u);
  ASSERT_FALSE(kept.reports.empty());
  EXPECT_EQ(kept.reports.front().rewrites(), 0) << "canonicalize_masked_scores left it";
}

}  // namespace
}  // namespace onnxopt
