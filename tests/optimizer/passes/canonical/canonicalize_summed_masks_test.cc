// canonicalize_summed_masks: two masks added in turn on the scores become one summed mask, exactly,
// and a term computed from the scores is left where it is; a scale after the sum of the scores and a
// position term goes on each term (the scores found between two MatMuls by what they are computed from).
#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::PassRun;
using testing::RunPass;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

// Softmax((q k^T + causal) + padding); `second` is the second term's value ("padding", or "scores" for
// a term computed from them).
onnx::ModelProto TwoMasksModel(const std::string& second) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("q", {2, 2, 3, 4});
  *graph.add_input() = FloatValue("k", {2, 2, 3, 4});
  *graph.add_input() = FloatValue("causal", {1, 1, 3, 3});
  *graph.add_input() = FloatValue("padding", {2, 1, 1, 3});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"k"}, {"k_t"}), "perm", {0, 1, 3, 2});
  *graph.add_node() = MakeNode("MatMul", {"q", "k_t"}, {"scores"});
  *graph.add_node() = MakeNode("Add", {"causal", "scores"}, {"causal_scores"});
  if (second == "scores") *graph.add_node() = MakeNode("Relu", {"scores"}, {"from_scores"});
  *graph.add_node() = MakeNode("Add", {"causal_scores", second == "scores" ? "from_scores" : "padding"}, {"masked"});
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"masked"}, {"probs"}), "axis", -1);
  *graph.add_output() = FloatValue("probs", {2, 2, 3, 3});
  return MakeModel(graph, 17);
}

TEST(CanonicalizeSummedMasksTest, TwoMasksInTurnBecomeTheScoresPlusTheirSum) {
  const onnx::ModelProto original = TwoMasksModel("padding");
  PassRun run = RunPass("canonicalize_summed_masks", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Add" && node.output(0) == "masked") {
      EXPECT_EQ(node.input(0), "scores");
    }
  }
  // The generated inputs are any floats: the sum rounds within an ulp of the two Adds.
  ExpectSameOutputs(original, run.model, 1e-6, 1e-6);
}

TEST(CanonicalizeSummedMasksTest, ATermComputedFromTheScoresStays) {
  PassRun run = RunPass("canonicalize_summed_masks", TwoMasksModel("scores"));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 0);
}

// Softmax(Div(Add(q k^T, position term), 8) + mask): the position term is `positions` [1, 2, 3, 3] (an
// input), or with `term_matmul` q p^T of a table p that reads nothing of q's (WeNet's, without a shift),
// first in the sum where `term_first`.
onnx::ModelProto ScaledSumModel(bool term_matmul, bool term_first) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 2, 3, 4});
  *graph.add_input() = FloatValue("table", {1, 2, 4, 3});
  *graph.add_input() = FloatValue("positions", {1, 2, 3, 3});
  *graph.add_input() = FloatValue("padding", {2, 1, 1, 3});
  *graph.add_node() = MakeNode("Relu", {"x"}, {"q"});
  *graph.add_node() = MakeNode("Sigmoid", {"x"}, {"k"});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"k"}, {"k_t"}), "perm", {0, 1, 3, 2});
  *graph.add_node() = MakeNode("MatMul", {"q", "k_t"}, {"scores"});
  if (term_matmul) *graph.add_node() = MakeNode("MatMul", {"q", "table"}, {"term"});
  const std::string term = term_matmul ? "term" : "positions";
  *graph.add_node() = MakeNode("Add", term_first ? std::vector<std::string>{term, "scores"}
                                                 : std::vector<std::string>{"scores", term},
                               {"summed"});
  *graph.add_initializer() = testing::FloatTensor("scale", {}, {8.0f});
  *graph.add_node() = MakeNode("Div", {"summed", "scale"}, {"scaled"});
  *graph.add_node() = MakeNode("Add", {"scaled", "padding"}, {"masked"});
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"masked"}, {"probs"}), "axis", -1);
  *graph.add_output() = FloatValue("probs", {2, 2, 3, 3});
  return MakeModel(graph, 17);
}

// The input the scores' MatMul reads first in `model`, after the pass: what it took as Q*K^T.
std::string ScaledScoresOperand(const onnx::ModelProto& model) {
  for (const auto& node : model.graph().node()) {
    if (node.op_type() == "Add" && node.output(0) == "masked") {
      for (const auto& div : model.graph().node()) {
        if (div.op_type() == "Div" && div.output(0) == node.input(0)) return div.input(0);
      }
    }
  }
  return "";
}

TEST(CanonicalizeSummedMasksTest, AScaleAfterThePositionTermsSumGoesOnEachTerm) {
  const onnx::ModelProto original = ScaledSumModel(false, false);
  PassRun run = RunPass("canonicalize_summed_masks", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 2);  // the scale distributed, then the term and the mask summed
  EXPECT_EQ(ScaledScoresOperand(run.model), "scores");
  ExpectSameOutputs(original, run.model, 1e-6, 1e-6);
}

TEST(CanonicalizeSummedMasksTest, OfTwoMatMulsTheScoresAreTheOneWhoseOperandsShareASource) {
  for (bool term_first : {false, true}) {
    const onnx::ModelProto original = ScaledSumModel(true, term_first);
    PassRun run = RunPass("canonicalize_summed_masks", original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(ScaledScoresOperand(run.model), "scores") << "term first: " << term_first;
    ExpectSameOutputs(original, run.model, 1e-6, 1e-6);
  }
}

// A deep model's later layer: its position term computed through hundreds of nodes (here 600 Relus on
// the positions, placed before the scores) is still known not to read the scores, which come after them.
TEST(CanonicalizeSummedMasksTest, ATermComputedLongBeforeTheScoresIsIndependentOfThem) {
  onnx::ModelProto model = ScaledSumModel(false, false);
  onnx::GraphProto* graph = model.mutable_graph();
  std::vector<onnx::NodeProto> nodes(graph->node().begin(), graph->node().end());
  graph->clear_node();
  std::string chain = "positions";
  for (int i = 0; i < 600; ++i) {
    const std::string next = "positions_" + std::to_string(i);
    *graph->add_node() = MakeNode("Relu", {chain}, {next});
    chain = next;
  }
  for (onnx::NodeProto node : nodes) {
    for (auto& input : *node.mutable_input()) {
      if (input == "positions") input = chain;
    }
    *graph->add_node() = node;
  }
  PassRun run = RunPass("canonicalize_summed_masks", model);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 2);
  ExpectSameOutputs(model, run.model, 1e-6, 1e-6);
}

}  // namespace
}  // namespace onnxopt
