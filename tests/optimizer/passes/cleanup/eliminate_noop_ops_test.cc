// eliminate_noop_ops: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
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
using testing::PassRun;
using testing::RunPass;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

TEST(EliminateNoopOpsTest, RemovesEveryKindOfNoop) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"x"}, {"a"}), "to", onnx::TensorProto::FLOAT);
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"a"}, {"b"}), "perm", {0, 1});
  *graph.add_node() = MakeNode("Concat", {"b"}, {"c"});
  (*graph.mutable_node(2)->add_attribute()) = WithIntAttribute(onnx::NodeProto(), "axis", 0).attribute(0);
  *graph.add_node() = MakeNode("Reshape", {"c", "shape"}, {"d"});
  *graph.add_node() = MakeNode("Slice", {"d", "zeros", "big"}, {"e"});
  *graph.add_node() = MakeNode("Pad", {"e", "no_pads"}, {"f"});
  *graph.add_node() = MakeNode("Relu", {"f"}, {"y"});
  *graph.add_initializer() = MakeInt64Tensor("shape", {2, 3});
  *graph.add_initializer() = MakeInt64Tensor("zeros", {0, 0});
  *graph.add_initializer() = MakeInt64Tensor("big", {INT64_MAX, INT64_MAX});
  *graph.add_initializer() = MakeInt64Tensor("no_pads", {0, 0, 0, 0});
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_output() = FloatValue("y", {2, 3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("eliminate_noop_ops", original);
  EXPECT_EQ(run.report.rewrites(), 6);
  EXPECT_EQ(run.model.graph().node_size(), 1);
  ExpectSameOutputs(original, run.model);
}

TEST(EliminateNoopOpsTest, KeepsCastsThatConvertAndReshapesThatReshape) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntAttribute(MakeNode("Cast", {"x"}, {"a"}), "to", onnx::TensorProto::DOUBLE);
  *graph.add_node() = MakeNode("Reshape", {"a", "shape"}, {"y"});
  *graph.add_initializer() = MakeInt64Tensor("shape", {3, 2});
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_output() = MakeValue("y", onnx::TensorProto::DOUBLE, {3, 2});
  PassRun run = RunPass("eliminate_noop_ops", MakeModel(graph, 13));
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(run.model.graph().node_size(), 2);
}

// tf2onnx writes StridedSlice's "to the end" as 1e9 in int32: a no-op where the axis' size is known; an end
// inside the axis slices (and one at its exact size stays for the matchers that read such slices).
onnx::TensorProto Int32Tensor(const std::string& name, const std::vector<int32_t>& values) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(onnx::TensorProto::INT32);
  tensor.add_dims(static_cast<int64_t>(values.size()));
  for (int32_t value : values) tensor.add_int32_data(value);
  return tensor;
}

TEST(EliminateNoopOpsTest, ASliceEndingPastEveryKnownSizeIsANoop) {
  auto model = [](int32_t last_end) {
    onnx::GraphProto graph;
    *graph.add_node() = MakeNode("Slice", {"x", "starts", "ends", "axes"}, {"s"});
    *graph.add_node() = MakeNode("Relu", {"s"}, {"y"});
    *graph.add_initializer() = Int32Tensor("starts", {0, 0});
    *graph.add_initializer() = Int32Tensor("ends", {1000000000, last_end});
    *graph.add_initializer() = Int32Tensor("axes", {0, -1});
    *graph.add_input() = FloatValue("x", {2, 3});
    onnx::ValueInfoProto y = FloatValue("y", {});
    y.mutable_type()->mutable_tensor_type()->clear_shape();
    *graph.add_output() = y;
    return MakeModel(graph, 13);
  };
  const onnx::ModelProto whole = model(1000000000);
  PassRun run = RunPass("eliminate_noop_ops", whole);
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(run.model.graph().node_size(), 1);
  ExpectSameOutputs(whole, run.model);
  EXPECT_EQ(RunPass("eliminate_noop_ops", model(2)).report.rewrites(), 0) << "ends inside the last axis";
  EXPECT_EQ(RunPass("eliminate_noop_ops", model(3)).report.rewrites(), 0) << "an exact end is kept";
}

}  // namespace
}  // namespace onnxopt
