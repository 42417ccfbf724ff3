// canonicalize_shape_reads: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
#include <map>

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
using testing::RandomFloats;
using testing::RunConfig;

// A named dim read from an intermediate value is read from the graph input that defines it, so the
// intermediate is not kept alive for its size.
TEST(CanonicalizeShapeReadsTest, ReadsNamedDimsFromTheInput) {
  onnx::GraphProto graph;
  onnx::ValueInfoProto x = FloatValue("x", {-1, 0, 4});
  x.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
  *graph.add_input() = x;
  *graph.add_initializer() = FloatTensor("w", {4, 4}, RandomFloats(16, 3));
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  graph.mutable_initializer(1)->clear_dims();  // a scalar index
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"h"});
  *graph.add_node() = MakeNode("Shape", {"h"}, {"h_shape"});
  *graph.add_node() = MakeNode("Gather", {"h_shape", "one"}, {"length"});
  onnx::ValueInfoProto length;
  length.set_name("length");
  length.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  *graph.add_output() = length;
  *graph.add_output() = FloatValue("h", {-1, 0, 4});
  graph.mutable_output(1)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
  const onnx::ModelProto original = MakeModel(graph, 17);
  PassRun run = RunConfig(R"({"passes": [{"name": "canonicalize_shape_reads"}, {"name": "eliminate_dead_nodes"}]})",
                          original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Shape") {
      EXPECT_EQ(node.input(0), "x") << "the size comes from the input";
    }
  }
  EXPECT_EQ(OpCounts(run.model)["Shape"], 1);
  ExpectSameOutputs(original, run.model, 0, 0);
}

// Every layer reads the same positions: equal position constants are made once and shared, and a
// scalar index and a one-element index stay apart (each keeps its rank).
TEST(CanonicalizeShapeReadsTest, ReadsOfTheSamePositionShareOneConstant) {
  onnx::GraphProto graph;
  onnx::ValueInfoProto x = FloatValue("x", {-1, 0, 4});
  x.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
  *graph.add_input() = x;
  *graph.add_initializer() = FloatTensor("w", {4, 4}, RandomFloats(16, 3));
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  graph.mutable_initializer(1)->clear_dims();  // a scalar index
  *graph.add_initializer() = MakeInt64Tensor("one_1d", {1});
  const std::vector<std::pair<std::string, std::string>> reads = {{"h1", "one"}, {"h2", "one"}, {"h3", "one_1d"}};
  std::string previous = "x";
  for (const auto& [h, index] : reads) {
    *graph.add_node() = MakeNode("MatMul", {previous, "w"}, {h});
    *graph.add_node() = MakeNode("Shape", {h}, {h + "_shape"});
    *graph.add_node() = MakeNode("Gather", {h + "_shape", index}, {h + "_length"});
    onnx::ValueInfoProto length;
    length.set_name(h + "_length");
    length.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    *graph.add_output() = length;
    previous = h;
  }
  const onnx::ModelProto original = MakeModel(graph, 17);
  PassRun run = testing::RunPass("canonicalize_shape_reads", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 3);
  std::map<std::string, std::string> index_of;  // Gather output -> its index
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() == "Gather") index_of[node.output(0)] = node.input(1);
  }
  EXPECT_EQ(index_of["h1_length"], index_of["h2_length"]) << "one constant for both scalar reads";
  EXPECT_NE(index_of["h1_length"], index_of["h3_length"]) << "a scalar and a 1-D index differ in rank";
  EXPECT_EQ(run.model.graph().initializer_size(), 5) << "w, one, one_1d and the two new indices";
  ExpectSameOutputs(original, run.model, 0, 0);
}

// torch's `k.size(-2)` in some exports is Slice(Shape(k), [-2], [-1]): read from the input too, and
// a Slice that reads two dims stays as it is.
TEST(CanonicalizeShapeReadsTest, ReadsOneDimSlicesOfAShapeFromTheInput) {
  for (const bool one_dim : {true, false}) {
    onnx::GraphProto graph;
    onnx::ValueInfoProto x = FloatValue("x", {-1, 0, 4});
    x.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
    *graph.add_input() = x;
    *graph.add_initializer() = FloatTensor("w", {4, 4}, RandomFloats(16, 3));
    *graph.add_initializer() = MakeInt64Tensor("starts", {-2});
    *graph.add_initializer() = MakeInt64Tensor("ends", {one_dim ? -1 : 3});
    *graph.add_initializer() = MakeInt64Tensor("axes", {0});
    *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"h"});
    *graph.add_node() = MakeNode("Shape", {"h"}, {"h_shape"});
    *graph.add_node() = MakeNode("Slice", {"h_shape", "starts", "ends", "axes"}, {"length"});
    onnx::ValueInfoProto length;
    length.set_name("length");
    length.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    *graph.add_output() = length;
    *graph.add_output() = FloatValue("h", {-1, 0, 4});
    graph.mutable_output(1)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
    const onnx::ModelProto original = MakeModel(graph, 17);
    PassRun run = testing::RunPass("canonicalize_shape_reads", original);
    EXPECT_EQ(run.report.rewrites(), one_dim ? 1 : 0);
    std::map<std::string, std::string> shape_of;  // Shape output -> what it reads
    for (const auto& node : run.model.graph().node()) {
      if (node.op_type() == "Shape") shape_of[node.output(0)] = node.input(0);
    }
    for (const auto& node : run.model.graph().node()) {
      if (node.op_type() == "Slice") {
        EXPECT_EQ(shape_of[node.input(0)], one_dim ? "x" : "h");
      }
    }
    ExpectSameOutputs(original, run.model, 0, 0);
  }
}

}  // namespace
}  // namespace onnxopt
