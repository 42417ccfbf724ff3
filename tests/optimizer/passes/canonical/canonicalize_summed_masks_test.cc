// canonicalize_summed_masks: two masks added in turn on the scores become one summed mask, exactly,
// and a term computed from the scores is left where it is.
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
    if (node.op_type() == "Add" && node.output(0) == "masked") EXPECT_EQ(node.input(0), "scores");
  }
  // The generated inputs are any floats: the sum rounds within an ulp of the two Adds.
  ExpectSameOutputs(original, run.model, 1e-6, 1e-6);
}

TEST(CanonicalizeSummedMasksTest, ATermComputedFromTheScoresStays) {
  PassRun run = RunPass("canonicalize_summed_masks", TwoMasksModel("scores"));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 0);
}

}  // namespace
}  // namespace onnxopt
