// canonicalize_head_biases: a constant [N, D] bias added to split heads moves into the projection's
// bias before the split, for each Add of one split (ESPnet's q + u and q + v), exactly up to one float
// addition; a bias that is not per head stays.
#include "gtest/gtest.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::OpCounts;
using testing::PassRun;
using testing::RandomFloats;
using testing::RunPass;

// x [2, 3, 8] -> Add(MatMul(x, W), b) -> Reshape [0, 0, 2, 4] -> + u (and + v where `two_biases`), each
// a graph output; `bias_dims` is u's (and v's) shape.
onnx::ModelProto SplitHeadsPlusBias(bool two_biases, std::vector<int64_t> bias_dims) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 3, 8});
  *graph.add_initializer() = FloatTensor("w", {8, 8}, RandomFloats(64, 1));
  *graph.add_initializer() = FloatTensor("b", {8}, RandomFloats(8, 2));
  int64_t count = 1;
  for (int64_t d : bias_dims) count *= d;
  *graph.add_initializer() = FloatTensor("u", bias_dims, RandomFloats(static_cast<size_t>(count), 3));
  *graph.add_initializer() = FloatTensor("v", bias_dims, RandomFloats(static_cast<size_t>(count), 4));
  onnx::TensorProto shape;
  shape.set_name("heads");
  shape.set_data_type(onnx::TensorProto::INT64);
  shape.add_dims(4);
  for (int64_t v : {0, 0, 2, 4}) shape.add_int64_data(v);
  *graph.add_initializer() = shape;
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"projected"});
  *graph.add_node() = MakeNode("Add", {"projected", "b"}, {"biased"});
  *graph.add_node() = MakeNode("Reshape", {"biased", "heads"}, {"split"});
  *graph.add_node() = MakeNode("Add", {"split", "u"}, {"with_u"});
  *graph.add_output() = FloatValue("with_u", {2, 3, 2, 4});
  if (two_biases) {
    *graph.add_node() = MakeNode("Add", {"v", "split"}, {"with_v"});
    *graph.add_output() = FloatValue("with_v", {2, 3, 2, 4});
  }
  return MakeModel(graph, 17);
}

TEST(CanonicalizeHeadBiasesTest, APerHeadBiasJoinsTheProjectionsBias) {
  const onnx::ModelProto original = SplitHeadsPlusBias(false, {2, 4});
  PassRun run = RunPass("canonicalize_head_biases", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Add"], 1);  // b + u, once, on the MatMul
  EXPECT_EQ(ops["Reshape"], 1);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Add") EXPECT_EQ(node.input(0), "projected");
  }
  ExpectSameOutputs(original, run.model, 1e-6, 1e-6);
}

TEST(CanonicalizeHeadBiasesTest, TwoBiasesOnOneSplitBecomeTwoProjections) {
  const onnx::ModelProto original = SplitHeadsPlusBias(true, {1, 1, 2, 4});
  PassRun run = RunPass("canonicalize_head_biases", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 2);
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Add"], 2);
  EXPECT_EQ(ops["Reshape"], 2);
  EXPECT_EQ(ops["MatMul"], 1);
  ExpectSameOutputs(original, run.model, 1e-6, 1e-6);
}

TEST(CanonicalizeHeadBiasesTest, ABiasThatIsNotPerHeadStays) {
  // [3, 2, 4] varies along the sequence: it cannot go into the projection's [8] bias.
  PassRun run = RunPass("canonicalize_head_biases", SplitHeadsPlusBias(false, {3, 2, 4}));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 0);
}

}  // namespace
}  // namespace onnxopt
