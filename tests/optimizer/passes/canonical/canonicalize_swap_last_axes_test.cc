// canonicalize_swap_last_axes: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
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
using testing::OpCounts;
using testing::PassRun;
using testing::RunConfig;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

// dynamo's k.transpose(-2, -1): Reshape to [-1, a, b] -> Transpose(0,2,1) -> Reshape to s[:-2] + [b, a],
// every shape read from the tensor at run time, becomes one Transpose of the last two axes.
onnx::ModelProto SwapLastAxesModel(int64_t second_start) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 3, 4, 5});
  *graph.add_initializer() = MakeInt64Tensor("minus_one", {-1});
  *graph.add_initializer() = MakeInt64Tensor("m2", {-2});
  *graph.add_initializer() = MakeInt64Tensor("m1", {-1});
  *graph.add_initializer() = MakeInt64Tensor("begin", {std::numeric_limits<int64_t>::min()});
  *graph.add_initializer() = MakeInt64Tensor("end", {std::numeric_limits<int64_t>::max()});
  *graph.add_initializer() = MakeInt64Tensor("second_start", {second_start});
  *graph.add_node() = MakeNode("Shape", {"x"}, {"s"});
  *graph.add_node() = MakeNode("Slice", {"s", "m2", "m1"}, {"a"});             // s[-2:-1]
  *graph.add_node() = MakeNode("Slice", {"s", "m1", "end"}, {"b"});            // s[-1:]
  *graph.add_node() = MakeNode("Slice", {"s", "begin", "second_start"}, {"p"});  // s[:-2] when -2
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"minus_one", "a", "b"}, {"flat_shape"}), "axis", 0);
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"p", "b", "a"}, {"back_shape"}), "axis", 0);
  *graph.add_node() = MakeNode("Reshape", {"x", "flat_shape"}, {"flat"});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"flat"}, {"swapped"}), "perm", {0, 2, 1});
  *graph.add_node() = MakeNode("Reshape", {"swapped", "back_shape"}, {"y"});
  onnx::ValueInfoProto output = FloatValue("y", {});
  output.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = output;
  return MakeModel(graph, 17);
}

TEST(CanonicalizeSwapLastAxesTest, ThreeNodesBecomeOneTranspose) {
  const onnx::ModelProto original = SwapLastAxesModel(-2);
  PassRun run = RunConfig(R"({"passes": [{"name": "canonicalize_swap_last_axes"}, {"name": "eliminate_dead_nodes"}]})",
                          original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Transpose"], 1);
  EXPECT_EQ(ops.count("Reshape"), 0u);
  EXPECT_EQ(ops.count("Shape"), 0u) << "the shape arithmetic goes with it";
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Transpose") {
      EXPECT_EQ(node.attribute(0).ints_size(), 4);
    }
  }
  ExpectSameOutputs(original, run.model, 0, 0);
  // Another reshape (here keeping only s[:-3]) is not the same thing, and stays.
  PassRun other = testing::RunPass("canonicalize_swap_last_axes", SwapLastAxesModel(-3));
  EXPECT_EQ(other.report.rewrites(), 0);
}

// The same once constant folding made the shapes values (x's dims known): [-1, 4, 5] and [2, 3, 5, 4].
// Shapes that are not x's swapped dims stay.
TEST(CanonicalizeSwapLastAxesTest, ShapesFoldedToConstantsStillSwap) {
  auto model = [](std::vector<int64_t> back_shape) {
    onnx::GraphProto graph;
    *graph.add_input() = FloatValue("x", {2, 3, 4, 5});
    *graph.add_initializer() = MakeInt64Tensor("flat_shape", {-1, 4, 5});
    *graph.add_initializer() = MakeInt64Tensor("back_shape", back_shape);
    *graph.add_node() = MakeNode("Reshape", {"x", "flat_shape"}, {"flat"});
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"flat"}, {"swapped"}), "perm", {0, 2, 1});
    *graph.add_node() = MakeNode("Reshape", {"swapped", "back_shape"}, {"y"});
    *graph.add_output() = FloatValue("y", {});
    return MakeModel(graph, 17);
  };
  const onnx::ModelProto original = model({2, 3, 5, 4});
  PassRun run = testing::RunPass("canonicalize_swap_last_axes", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model).count("Reshape"), 0u);
  ExpectSameOutputs(original, run.model, 0, 0);
  EXPECT_EQ(testing::RunPass("canonicalize_swap_last_axes", model({3, 2, 5, 4})).report.rewrites(), 0);
}

}  // namespace
}  // namespace onnxopt
