// canonicalize_flattened_rows: rows flattened from [B, S, H] (TF1 BERT through tf2onnx) are computed on
// [B, S, W] where every reader takes that, left as they are where one does not, and the rewritten model
// computes the same outputs in ONNX Runtime.
#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
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
using testing::RunPass;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

// x [2, 3, 4] flattened to rows [6, 4]; a Dense, a residual and a LayerNorm reduction over axis 1 of the
// rows; the rows split into heads [2, 3, 2, 2] at the end (an exit). `reader` adds a node that needs the
// rows: "" none, "shape" a Shape of them, "output" the rows as a graph output, "zero" an exit to [0, -1].
onnx::ModelProto RowsModel(const std::string& reader) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 3, 4});
  *graph.add_initializer() = MakeInt64Tensor("matrix", {-1, 4});
  *graph.add_initializer() = MakeInt64Tensor("heads", {2, 3, 2, 2});
  *graph.add_initializer() = MakeInt64Tensor("keep_rows", {0, -1});
  *graph.add_initializer() = FloatTensor("w", {4, 4}, {0.5f, -1, 0.25f, 2, 1, 0, -0.5f, 1, 0.75f, 1, 1, -1, 0, 2, 0.5f, 0.25f});
  *graph.add_initializer() = FloatTensor("b", {4}, {0.1f, -0.2f, 0.3f, 0});
  *graph.add_initializer() = FloatTensor("scale", {1, 4}, {1, 2, 0.5f, 1});
  *graph.add_node() = MakeNode("Reshape", {"x", "matrix"}, {"rows"});
  *graph.add_node() = MakeNode("MatMul", {"rows", "w"}, {"dense"});
  *graph.add_node() = MakeNode("Add", {"dense", "b"}, {"biased"});
  *graph.add_node() = MakeNode("Add", {"biased", "rows"}, {"residual"});
  *graph.add_node() = WithIntAttribute(WithIntsAttribute(MakeNode("ReduceMean", {"residual"}, {"mean"}), "axes", {1}),
                                       "keepdims", 1);
  *graph.add_node() = MakeNode("Sub", {"residual", "mean"}, {"centered"});
  *graph.add_node() = MakeNode("Mul", {"centered", "scale"}, {"scaled"});
  *graph.add_node() = MakeNode("Reshape", {"scaled", "heads"}, {"y"});
  *graph.add_output() = FloatValue("y", {2, 3, 2, 2});
  if (reader == "shape") {
    *graph.add_node() = MakeNode("Shape", {"centered"}, {"rows_shape"});
    onnx::ValueInfoProto shape;
    shape.set_name("rows_shape");
    shape.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    *graph.add_output() = shape;
  } else if (reader == "output") {
    *graph.add_output() = FloatValue("centered", {6, 4});
  } else if (reader == "zero") {
    *graph.add_node() = MakeNode("Reshape", {"scaled", "keep_rows"}, {"kept"});
    *graph.add_output() = FloatValue("kept", {6, 4});
  }
  return MakeModel(graph, 13);
}

TEST(CanonicalizeFlattenedRowsTest, TheRowsAreComputedOnTheTensorTheyCameFrom) {
  const onnx::ModelProto original = RowsModel("");
  PassRun run = RunPass("canonicalize_flattened_rows", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1) << "one group of rows";
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Reshape"], 1) << "the flattening is gone, the heads' split stays";
  EXPECT_EQ(ops["MatMul"], 1);
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "ReduceMean") {
      ASSERT_EQ(node.attribute_size(), 2);
      for (const auto& attribute : node.attribute()) {
        if (attribute.name() == "axes") EXPECT_EQ(attribute.ints(0), -1) << "the rows' axis 1 is the last axis";
      }
    }
    if (node.op_type() == "MatMul") EXPECT_EQ(node.input(0), "x");
  }
  ExpectSameOutputs(original, run.model, 1e-6, 1e-6);
}

// A reader that needs the rows themselves keeps the whole group as it is: nothing is computed twice.
TEST(CanonicalizeFlattenedRowsTest, AGroupWithAReaderOfTheRowsStaysAsItIs) {
  for (const char* reader : {"shape", "output", "zero"}) {
    const onnx::ModelProto original = RowsModel(reader);
    PassRun run = RunPass("canonicalize_flattened_rows", original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_EQ(run.report.rewrites(), 0) << reader;
    EXPECT_EQ(run.model.graph().node_size(), original.graph().node_size()) << reader;
  }
}

// A context [2, 3, 2, 2] merged to rows [6, 4] enters as Reshape to [0, 0, 4]; a 2-D weight read on the
// left (MatMul(W, rows)) is no row-wise product and stops the group.
TEST(CanonicalizeFlattenedRowsTest, AMergedContextEntersAsItsThreeDimensionalMerge) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("context", {2, 3, 2, 2});
  *graph.add_initializer() = MakeInt64Tensor("merged", {6, 4});
  *graph.add_initializer() = MakeInt64Tensor("bsh", {2, 3, 4});
  *graph.add_initializer() = FloatTensor("w", {4, 4}, {0.5f, -1, 0.25f, 2, 1, 0, -0.5f, 1, 0.75f, 1, 1, -1, 0, 2, 0.5f, 0.25f});
  *graph.add_node() = MakeNode("Reshape", {"context", "merged"}, {"rows"});
  *graph.add_node() = MakeNode("MatMul", {"rows", "w"}, {"dense"});
  *graph.add_node() = MakeNode("Erf", {"dense"}, {"activated"});
  *graph.add_node() = MakeNode("Reshape", {"activated", "bsh"}, {"y"});
  *graph.add_output() = FloatValue("y", {2, 3, 4});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunPass("canonicalize_flattened_rows", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 1);
  bool merged_in_three = false;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Reshape" && node.input(0) == "context") {
      for (const auto& tensor : run.model.graph().initializer()) {
        if (tensor.name() == node.input(1)) merged_in_three = tensor.dims(0) == 3;
      }
    }
  }
  EXPECT_TRUE(merged_in_three) << "context reshaped to [0, 0, 4]";
  ExpectSameOutputs(original, run.model, 1e-6, 1e-6);

  onnx::GraphProto left = graph;
  *left.add_initializer() = FloatTensor("w6", {6, 6}, std::vector<float>(36, 0.5f));
  left.mutable_node(1)->set_input(0, "w6");
  left.mutable_node(1)->set_input(1, "rows");
  PassRun untouched = RunPass("canonicalize_flattened_rows", MakeModel(left, 13));
  EXPECT_EQ(untouched.report.rewrites(), 0);
}

}  // namespace
}  // namespace onnxopt
