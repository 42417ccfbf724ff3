// Tests for fix_dynamic_dims, eliminate_initializer_inputs, fuse_reshape_chains,
// fuse_matmul_add_into_gemm, fuse_conv_add_mul and convert_opset.
#include <limits>
#include <map>
#include <cmath>
#include <random>
#include <tuple>

#include "absl/strings/match.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/pass_manager.h"
#include "optimizer/passes/constants.h"
#include "optimizer/shape_info.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"
#include "tests/parity_matchers.h"

namespace onnxopt {
namespace {

using testing::ExpectSameOutputs;
using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::PassRun;
using testing::RunConfig;
using testing::WithIntsAttribute;
using testing::WithIntAttribute;
using testing::RandomFloats;
using testing::OpCounts;

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

TEST(FixDynamicDimsTest, SetsNamedDimsAndValidatesItsParameter) {
  auto model = LoadModel(testing::FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(model.ok());
  PassRun fixed = RunConfig(R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch=2, sequence=32"}}]})", *model);
  ASSERT_TRUE(fixed.status.ok()) << fixed.status;
  EXPECT_EQ(fixed.report.rewrites(), 10);  // 3 inputs and 2 outputs, 2 dims each
  const auto& dims = fixed.model.graph().input(0).type().tensor_type().shape().dim();
  EXPECT_EQ(dims[0].dim_value(), 2);
  EXPECT_EQ(dims[1].dim_value(), 32);
  for (const char* bad : {R"({"passes": [{"name": "fix_dynamic_dims"}]})",
                          R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch=0"}}]})",
                          R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch"}}]})"}) {
    EXPECT_EQ(RunConfig(bad, *model).status.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(EliminateInitializerInputsTest, MakesOverridableInitializersConstant) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "w"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {2}, {1, 2});
  *graph.add_input() = FloatValue("x", {2});
  *graph.add_input() = FloatValue("w", {2});
  *graph.add_output() = FloatValue("y", {2});
  PassRun run = RunConfig(R"({"passes": [{"name": "eliminate_initializer_inputs"}, {"name": "fold_constants"}]})",
                      MakeModel(graph, 13));
  ASSERT_TRUE(run.status.ok());
  ASSERT_EQ(run.model.graph().input_size(), 1);
  EXPECT_EQ(run.model.graph().input(0).name(), "x");
}

TEST(FuseReshapeChainsTest, CollapsesChains) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Reshape", {"x", "s1"}, {"a"});
  *graph.add_node() = MakeNode("Reshape", {"a", "s2"}, {"b"});
  *graph.add_node() = MakeNode("Unsqueeze", {"b", "ax0"}, {"c"});
  *graph.add_node() = MakeNode("Unsqueeze", {"c", "ax2"}, {"d"});    // [1, 6, 1, 4]
  *graph.add_node() = MakeNode("Squeeze", {"d", "ax0"}, {"e"});      // [6, 1, 4]
  *graph.add_node() = MakeNode("Squeeze", {"e", "ax1"}, {"f"});      // [6, 4]
  *graph.add_node() = MakeNode("Unsqueeze", {"f", "ax1"}, {"g"});
  *graph.add_node() = MakeNode("Squeeze", {"g", "ax1"}, {"y"});      // cancels out
  *graph.add_initializer() = MakeInt64Tensor("s1", {4, 6});
  *graph.add_initializer() = MakeInt64Tensor("s2", {6, 4});
  *graph.add_initializer() = MakeInt64Tensor("ax0", {0});
  *graph.add_initializer() = MakeInt64Tensor("ax1", {1});
  *graph.add_initializer() = MakeInt64Tensor("ax2", {2});
  *graph.add_input() = FloatValue("x", {2, 12});
  *graph.add_output() = FloatValue("y", {6, 4});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"preset": "extended"})", original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Reshape", 1}})) << run.model.graph().DebugString();
  ExpectSameOutputs(original, run.model, 0, 0);
}

TEST(FuseMatMulAddIntoGemmTest, FusesOnlyTwoDimensionalMatMuls) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Add", {"bias", "m"}, {"y"});
  *graph.add_node() = MakeNode("MatMul", {"x3", "w"}, {"m3"});
  *graph.add_node() = MakeNode("Add", {"m3", "bias"}, {"y3"});
  *graph.add_initializer() = FloatTensor("w", {4, 3}, RandomFloats(12, 1));
  *graph.add_initializer() = FloatTensor("bias", {3}, RandomFloats(3, 2));
  *graph.add_input() = FloatValue("x", {5, 4});
  *graph.add_input() = FloatValue("x3", {2, 5, 4});
  *graph.add_output() = FloatValue("y", {5, 3});
  *graph.add_output() = FloatValue("y3", {2, 5, 3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_matmul_add_into_gemm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Add", 1}, {"Gemm", 1}, {"MatMul", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

TEST(FuseConvAddMulTest, FoldsPerChannelScaleAndBias) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Conv", {"x", "w"}, {"c"});
  *graph.add_node() = MakeNode("Mul", {"c", "scale"}, {"m"});
  *graph.add_node() = MakeNode("Conv", {"m", "w2", "b2"}, {"c2"});
  *graph.add_node() = MakeNode("Add", {"shift", "c2"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {4, 3, 3, 3}, RandomFloats(108, 3));
  *graph.add_initializer() = FloatTensor("scale", {4, 1, 1}, RandomFloats(4, 4));
  *graph.add_initializer() = FloatTensor("w2", {2, 4, 1, 1}, RandomFloats(8, 5));
  *graph.add_initializer() = FloatTensor("b2", {2}, RandomFloats(2, 6));
  *graph.add_initializer() = FloatTensor("shift", {1, 2, 1, 1}, RandomFloats(2, 7));
  *graph.add_input() = FloatValue("x", {1, 3, 8, 8});
  *graph.add_output() = FloatValue("y", {1, 2, 6, 6});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_conv_add_mul"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Conv", 2}}));
  ExpectSameOutputs(original, run.model, 1e-4, 1e-4);
}

TEST(ConvertOpsetTest, ConvertsAndRefusesWhatOnnxCannot) {
  auto model = LoadModel(testing::FixturePath("cnn_tiny.onnx"));  // opset 13
  ASSERT_TRUE(model.ok());
  PassRun run = RunConfig(R"({"passes": [{"name": "convert_opset", "params": {"target_opset": 15}}]})", *model);
  ASSERT_TRUE(run.status.ok()) << run.status;
  int64_t opset = 0;
  for (const auto& import : run.model.opset_import()) {
    if (import.domain().empty()) opset = import.version();
  }
  EXPECT_EQ(opset, 15);
  ExpectSameOutputs(*model, run.model, 1e-6, 1e-6);
  EXPECT_EQ(RunConfig(R"({"passes": [{"name": "convert_opset", "params": {"target_opset": 21}}]})", *model).status.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunConfig(R"({"passes": [{"name": "convert_opset"}]})", *model).status.code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

// x[2,5,8] -> MatMul(W[8,8]) -> Add(b[8]) -> LayerNorm-like (ReduceMean, Sub, Div) -> Softmax -> Tanh
// -> Gather(axis 1, index 0) -> y[2,8]: every step is one the slice may climb.
onnx::ModelProto HeadModel(bool scalar_index) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Add", {"m", "b"}, {"a"});
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"a"}, {"mean"}), "axes", {-1});
  *graph.add_node() = MakeNode("Sub", {"a", "mean"}, {"centered"});
  *graph.add_node() = MakeNode("Div", {"centered", "two"}, {"scaled"});
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"scaled"}, {"p"}), "axis", -1);
  *graph.add_node() = MakeNode("Tanh", {"p"}, {"t"});
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"t", "index"}, {"y"}), "axis", 1);
  *graph.add_initializer() = FloatTensor("w", {8, 8}, RandomFloats(64, 11));
  *graph.add_initializer() = FloatTensor("b", {8}, RandomFloats(8, 12));
  *graph.add_initializer() = FloatTensor("two", {}, {2.0f});
  onnx::TensorProto index = MakeInt64Tensor("index", {3});
  if (scalar_index) index.clear_dims();
  *graph.add_initializer() = index;
  *graph.add_input() = FloatValue("x", {2, 5, 8});
  onnx::ValueInfoProto output = FloatValue("y", {});
  output.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = output;
  return MakeModel(graph, 13);
}

TEST(UpstreamSliceTest, ClimbsToTheInputSoEveryNodeComputesOneRow) {
  for (bool scalar : {true, false}) {
    const onnx::ModelProto original = HeadModel(scalar);
    PassRun run = RunConfig(R"({"passes": [{"name": "upstream_slice"}, {"name": "eliminate_common_subexpressions"},
                                      {"name": "upstream_slice"}]})", original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    // The only Gather left reads the graph input: everything after it runs on one row.
    int gathers_on_input = 0, gathers = 0;
    for (const auto& node : run.model.graph().node()) {
      if (node.op_type() != "Gather") continue;
      ++gathers;
      gathers_on_input += node.input(0) == "x";
    }
    EXPECT_EQ(gathers, 1) << run.model.graph().DebugString();
    EXPECT_EQ(gathers_on_input, 1);
    ExpectSameOutputs(original, run.model, 0, 0);
  }
}

TEST(UpstreamSliceTest, CrossesTransposes) {
  for (bool scalar : {true, false}) {
    onnx::GraphProto graph;
    *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"x"}, {"t"}), "perm", {2, 0, 1});  // [4,2,3]
    *graph.add_node() = MakeNode("Relu", {"t"}, {"r"});
    *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"r", "index"}, {"y"}), "axis", 1);
    onnx::TensorProto index = MakeInt64Tensor("index", {1});
    if (scalar) index.clear_dims();
    *graph.add_initializer() = index;
    *graph.add_input() = FloatValue("x", {2, 3, 4});
    onnx::ValueInfoProto output = FloatValue("y", {});
    output.mutable_type()->mutable_tensor_type()->clear_shape();
    *graph.add_output() = output;
    const onnx::ModelProto original = MakeModel(graph, 13);
    PassRun run = RunConfig(R"({"passes": [{"name": "upstream_slice"}]})", original);
    ASSERT_TRUE(run.status.ok());
    EXPECT_EQ(run.report.rewrites(), 2) << scalar;
    EXPECT_EQ(run.model.graph().node(0).op_type(), "Gather") << run.model.graph().DebugString();
    ExpectSameOutputs(original, run.model, 0, 0);
  }
}

TEST(UpstreamSliceTest, StaysWhereMovingWouldChangeTheResult) {
  // Softmax over the sliced axis, and an input broadcasting along it with size 1.
  onnx::GraphProto graph;
  *graph.add_node() = WithIntAttribute(MakeNode("Softmax", {"x"}, {"p"}), "axis", 1);
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"p", "index"}, {"y"}), "axis", 1);
  *graph.add_node() = MakeNode("Add", {"x", "ones"}, {"s"});
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"s", "index"}, {"z"}), "axis", 1);
  onnx::TensorProto index = MakeInt64Tensor("index", {0});
  index.clear_dims();
  *graph.add_initializer() = index;
  *graph.add_input() = FloatValue("x", {2, 5, 8});
  *graph.add_input() = FloatValue("ones", {2, 1, 8});
  *graph.add_output() = FloatValue("y", {2, 8});
  *graph.add_output() = FloatValue("z", {2, 8});
  PassRun run = RunConfig(R"({"passes": [{"name": "upstream_slice"}]})", MakeModel(graph, 13));
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 0);
}

// The exported RoBERTa-style classifier, dynamic batch and sequence as exported: symbolic shape
// recovery lets the token slice climb through the last layer.
TEST(UpstreamSliceTest, ShrinksTheDynamicRobertaHead) {
  auto original = LoadModel(testing::FixturePath("roberta_cls.onnx"));
  ASSERT_TRUE(original.ok());
  for (bool fixed_dims : {false, true}) {
    onnx::ModelProto start = *original;
    if (fixed_dims) {
      PassRun fixed = RunConfig(R"({"passes": [{"name": "fix_dynamic_dims", "params": {"dims": "batch=2,sequence=16"}}]})",
                            *original);
      ASSERT_TRUE(fixed.status.ok());
      start = fixed.model;
    }
    v1::OptimizationConfig config;
    config.set_preset("extended");
    auto pipeline = BuildPipeline(config, DefaultPassRegistry());
    onnx::ModelProto model = start;
    std::vector<v1::PassReport> reports;
    ASSERT_TRUE(RunPipeline(*pipeline, &model, {}, &reports).ok());
    int64_t moves = 0;
    for (const auto& report : reports) {
      if (report.name() == "upstream_slice") moves += report.rewrites();
    }
    EXPECT_GE(moves, 10) << "fixed dims " << fixed_dims << ": the token slice climbs through the last layer";
    ExpectSameOutputs(start, model, 1e-5, 1e-4);
  }
}

// After the transformer fusions the last layer is SkipLayerNormalization, BiasGelu/Gelu and MatMuls:
// the classification head's token slice still climbs through its feed-forward block (both exporters).
TEST(UpstreamSliceTest, ClimbsThroughFusedOperatorsToTheLastAttention) {
  for (const char* name : {"hf/roberta_cls_torchscript.onnx", "hf/roberta_cls_dynamo.onnx"}) {
    auto original = LoadModel(testing::FixturePath(name));
    ASSERT_TRUE(original.ok()) << name;
    PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    // Every SkipLayerNormalization after the last Attention reads sliced tokens.
    const auto& nodes = run.model.graph().node();
    int last_attention = -1;
    for (int i = 0; i < nodes.size(); ++i) {
      if (nodes[i].op_type() == "Attention") last_attention = i;
    }
    ASSERT_GE(last_attention, 0) << name;
    int sliced_norms = 0;
    for (int i = last_attention + 1; i < nodes.size(); ++i) {
      if (nodes[i].op_type() != "SkipLayerNormalization") continue;
      ++sliced_norms;
      EXPECT_TRUE(absl::StrContains(nodes[i].input(1), "_sliced")) << name << ": " << nodes[i].name();
    }
    EXPECT_EQ(sliced_norms, 2) << name << ": after attention and after the feed-forward block";
    v1::ParityReport parity;
    testing::ExpectParityOnPaddedBatches(*original, run.model, 2, {16, 128}, &parity);
  }
}

TEST(ShapeInfoTest, RecoversSymbolicShapesBehindDynamicReshapes) {
  auto model = LoadModel(testing::FixturePath("roberta_cls.onnx"));
  ASSERT_TRUE(model.ok());
  ShapeInfo info = ShapeInfo::Infer(*model);
  // onnx 1.12 alone knows neither of these.
  const onnx::TypeProto* heads = info.TypeOf("/encoder/layers.0/attention/Reshape_output_0");
  ASSERT_NE(heads, nullptr);
  ASSERT_EQ(heads->tensor_type().shape().dim_size(), 4);
  EXPECT_EQ(heads->tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(heads->tensor_type().shape().dim(1).dim_param(), "sequence");
  EXPECT_EQ(heads->tensor_type().shape().dim(2).dim_value(), 4);
  EXPECT_EQ(heads->tensor_type().shape().dim(3).dim_value(), 16);
  EXPECT_TRUE(info.SameShape("/encoder/Add_output_0", "/encoder/layers.1/output_norm/Add_1_output_0"));
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

TEST(FuseTransposeIntoGemmTest, FoldsTransposesIntoGemmAttributes) {
  onnx::GraphProto graph;
  onnx::NodeProto t1 = MakeNode("Transpose", {"a"}, {"at"});
  auto* perm = t1.add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::INTS);
  perm->add_ints(1);
  perm->add_ints(0);
  onnx::NodeProto t2 = t1;
  t2.set_input(0, "w");
  t2.set_output(0, "wt");
  t2.set_name("t2");
  *graph.add_node() = t1;
  *graph.add_node() = t2;
  onnx::NodeProto gemm = MakeNode("Gemm", {"at", "w", "c"}, {"g"});
  auto* trans_b = gemm.add_attribute();
  trans_b->set_name("transB");
  trans_b->set_type(onnx::AttributeProto::INT);
  trans_b->set_i(1);
  *graph.add_node() = gemm;
  *graph.add_node() = MakeNode("MatMul", {"g", "wt"}, {"y"});
  *graph.add_initializer() = FloatTensor("w", {3, 3}, RandomFloats(9, 21));
  *graph.add_initializer() = FloatTensor("c", {3}, RandomFloats(3, 22));
  *graph.add_input() = FloatValue("a", {3, 4});
  *graph.add_output() = FloatValue("y", {4, 3});
  const onnx::ModelProto original = MakeModel(graph, 13);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_transpose_into_gemm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 2);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Gemm", 2}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-5);
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

// x[2,4,8] -> decomposed LayerNorm (as torch exports it) -> y
onnx::ModelProto DecomposedLayerNorm(float exponent, bool leak) {
  onnx::GraphProto graph;
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"x"}, {"mean"}), "axes", {-1});
  *graph.add_node() = MakeNode("Sub", {"x", "mean"}, {"d"});
  *graph.add_node() = MakeNode("Pow", {"d", "two"}, {"sq"});
  *graph.add_node() = WithIntsAttribute(MakeNode("ReduceMean", {"sq"}, {"var"}), "axes", {-1});
  *graph.add_node() = MakeNode("Add", {"var", "eps"}, {"ve"});
  *graph.add_node() = MakeNode("Sqrt", {"ve"}, {"std"});
  *graph.add_node() = MakeNode("Div", {"d", "std"}, {"n"});
  *graph.add_node() = MakeNode("Mul", {"n", "gamma"}, {"scaled"});
  *graph.add_node() = MakeNode("Add", {"scaled", "beta"}, {"y"});
  *graph.add_initializer() = FloatTensor("two", {}, {exponent});
  *graph.add_initializer() = FloatTensor("eps", {}, {1e-5f});
  *graph.add_initializer() = FloatTensor("gamma", {8}, RandomFloats(8, 31));
  *graph.add_initializer() = FloatTensor("beta", {8}, RandomFloats(8, 32));
  *graph.add_input() = FloatValue("x", {2, 4, 8});
  *graph.add_output() = FloatValue("y", {2, 4, 8});
  if (leak) *graph.add_output() = FloatValue("std", {2, 4, 1});
  return MakeModel(graph, 17);
}

TEST(FuseLayerNormTest, FusesTheExportedFormExactly) {
  const onnx::ModelProto original = DecomposedLayerNorm(2.0f, false);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"LayerNormalization", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
}

// The fused kernels take scale and bias of the normalized width only: a broadcasting bias [1]
// stays an Add, and the result still loads and matches.
TEST(FuseLayerNormTest, KeepsABroadcastingBiasOutside) {
  onnx::ModelProto original = DecomposedLayerNorm(2.0f, false);
  for (auto& tensor : *original.mutable_graph()->mutable_initializer()) {
    if (tensor.name() == "beta") tensor = FloatTensor("beta", {1}, {0.25f});
  }
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"Add", 1}, {"LayerNormalization", 1}}));
  ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
}

TEST(FuseLayerNormTest, LeavesLookalikesAlone) {
  EXPECT_EQ(RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", DecomposedLayerNorm(3.0f, false)).report.rewrites(), 0)
      << "a cube is no variance";
  PassRun leak = RunConfig(R"({"passes": [{"name": "fuse_layer_norm"}]})", DecomposedLayerNorm(2.0f, true));
  EXPECT_EQ(leak.report.rewrites(), 0) << "the standard deviation is an output";
}

TEST(FuseLayerNormTest, FusesEveryLayerNormOfTheExportedEncoder) {
  auto original = LoadModel(testing::FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  // The 4 LayerNorms after a residual Add become SkipLayerNormalization, the embeddings' one
  // EmbedLayerNormalization.
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["SkipLayerNormalization"], 4);
  EXPECT_EQ(ops["EmbedLayerNormalization"], 1);
  EXPECT_EQ(ops.count("LayerNormalization"), 0u);
  EXPECT_EQ(ops["BiasGelu"], 2);
  EXPECT_EQ(ops.count("ReduceMean"), 0u);
  ExpectSameOutputs(*original, run.model, 1e-5, 1e-3);
}

onnx::ModelProto ResidualLayerNorm(bool sum_is_output) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("MatMul", {"x", "w"}, {"m"});
  *graph.add_node() = MakeNode("Add", {"bias", "m"}, {"biased"});
  *graph.add_node() = MakeNode("Add", {"biased", "x"}, {"sum"});
  *graph.add_node() = WithIntAttribute(MakeNode("LayerNormalization", {"sum", "gamma", "beta"}, {"y"}), "axis", -1);
  *graph.add_initializer() = FloatTensor("w", {8, 8}, RandomFloats(64, 51));
  *graph.add_initializer() = FloatTensor("bias", {8}, RandomFloats(8, 52));
  *graph.add_initializer() = FloatTensor("gamma", {8}, RandomFloats(8, 53));
  *graph.add_initializer() = FloatTensor("beta", {8}, RandomFloats(8, 54));
  *graph.add_input() = FloatValue("x", {2, 4, 8});
  *graph.add_output() = FloatValue("y", {2, 4, 8});
  if (sum_is_output) *graph.add_output() = FloatValue("sum", {2, 4, 8});
  return MakeModel(graph, 17);
}

TEST(FuseSkipLayerNormTest, LeavesADoubledValueAlone) {
  // s = Add(y, y) with y = Add(h, bias): fusing would read y after removing its producer.
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"x", "bias"}, {"y"});
  *graph.add_node() = MakeNode("Add", {"y", "y"}, {"sum"});
  *graph.add_node() = WithIntAttribute(MakeNode("LayerNormalization", {"sum", "gamma", "beta"}, {"out"}), "axis", -1);
  *graph.add_initializer() = FloatTensor("bias", {8}, RandomFloats(8, 61));
  *graph.add_initializer() = FloatTensor("gamma", {8}, RandomFloats(8, 62));
  *graph.add_initializer() = FloatTensor("beta", {8}, RandomFloats(8, 63));
  *graph.add_input() = FloatValue("x", {2, 4, 8});
  *graph.add_output() = FloatValue("out", {2, 4, 8});
  const onnx::ModelProto original = MakeModel(graph, 17);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_skip_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(run.report.rewrites(), 0);
  ExpectSameOutputs(original, run.model, 0, 0);
}

TEST(FuseSkipLayerNormTest, FusesTheResidualAndItsBias) {
  const onnx::ModelProto original = ResidualLayerNorm(false);
  PassRun run = RunConfig(R"({"passes": [{"name": "fuse_skip_layer_norm"}]})", original);
  ASSERT_TRUE(run.status.ok());
  EXPECT_EQ(OpCounts(run.model), (std::map<std::string, int>{{"MatMul", 1}, {"SkipLayerNormalization", 1}}));
  EXPECT_EQ(run.model.graph().node(1).input_size(), 5) << "the bias became SkipLayerNormalization's fifth input";
  ExpectSameOutputs(original, run.model, 1e-5, 1e-4);
  // A residual sum read elsewhere (here: a graph output) comes out of SkipLayerNormalization's 4th output.
  const onnx::ModelProto with_sum = ResidualLayerNorm(true);
  PassRun kept = RunConfig(R"({"passes": [{"name": "fuse_skip_layer_norm"}]})", with_sum);
  EXPECT_EQ(kept.report.rewrites(), 1);
  ASSERT_EQ(kept.model.graph().node(1).output_size(), 4);
  EXPECT_EQ(kept.model.graph().node(1).output(3), "sum");
  ExpectSameOutputs(with_sum, kept.model, 1e-5, 1e-4);
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

onnx::TensorProto Scalar(const std::string& name, float value) { return FloatTensor(name, {}, {value}); }

// h[2,8] -> Add(bias) -> x -> one of the Gelu forms -> y
onnx::ModelProto GeluModel(const std::string& form, bool leak = false) {
  onnx::GraphProto graph;
  *graph.add_node() = MakeNode("Add", {"h", "bias"}, {"x"});
  if (form == "erf") {
    *graph.add_node() = MakeNode("Div", {"x", "sqrt2"}, {"s"});
    *graph.add_node() = MakeNode("Erf", {"s"}, {"e"});
    *graph.add_node() = MakeNode("Add", {"one", "e"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"x", "a"}, {"m"});
    *graph.add_node() = MakeNode("Mul", {"m", "half"}, {"y"});
  } else if (form == "tanh") {
    *graph.add_node() = MakeNode("Pow", {"x", "three"}, {"p"});
    *graph.add_node() = MakeNode("Mul", {"c", "p"}, {"cp"});
    *graph.add_node() = MakeNode("Add", {"x", "cp"}, {"u"});
    *graph.add_node() = MakeNode("Mul", {"u", "k"}, {"s"});
    *graph.add_node() = MakeNode("Tanh", {"s"}, {"t"});
    *graph.add_node() = MakeNode("Add", {"t", "one"}, {"a"});
    *graph.add_node() = MakeNode("Mul", {"x", "half"}, {"hx"});
    *graph.add_node() = MakeNode("Mul", {"hx", "a"}, {"y"});
  } else {  // quick
    *graph.add_node() = MakeNode("Mul", {"alpha", "x"}, {"s"});
    *graph.add_node() = MakeNode("Sigmoid", {"s"}, {"g"});
    *graph.add_node() = MakeNode("Mul", {"g", "x"}, {"y"});
  }
  for (auto t : {Scalar("sqrt2", std::sqrt(2.0f)), Scalar("one", 1), Scalar("half", 0.5f), Scalar("three", 3),
                 Scalar("c", 0.044715f), Scalar("k", std::sqrt(2.0f / static_cast<float>(M_PI))), Scalar("alpha", 1.702f)}) {
    *graph.add_initializer() = t;
  }
  *graph.add_initializer() = FloatTensor("bias", {8}, RandomFloats(8, 41));
  *graph.add_input() = FloatValue("h", {2, 8});
  *graph.add_output() = FloatValue("y", {2, 8});
  if (leak) *graph.add_output() = FloatValue(form == "quick" ? "g" : "a", {2, 8});
  onnx::ModelProto model = MakeModel(graph, 13);
  return model;
}

TEST(FuseGeluTest, FusesEachFormAndAbsorbsTheBias) {
  for (const auto& [form, op, bias_absorbed] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"erf", "BiasGelu", true}, {"tanh", "FastGelu", true}, {"quick", "QuickGelu", false}}) {
    const onnx::ModelProto original = GeluModel(form);
    PassRun run = RunConfig(R"({"passes": [{"name": "fuse_gelu"}, {"name": "eliminate_unused_initializers"}]})", original);
    ASSERT_TRUE(run.status.ok()) << form;
    std::map<std::string, int> expected = {{op, 1}};
    if (!bias_absorbed) expected["Add"] = 1;
    EXPECT_EQ(OpCounts(run.model), expected) << form;
    bool imports_microsoft = false;
    for (const auto& import : run.model.opset_import()) imports_microsoft |= import.domain() == "com.microsoft";
    EXPECT_TRUE(imports_microsoft) << form;
    ExpectSameOutputs(original, run.model, 1e-4, 1e-3);
  }
}

TEST(FuseGeluTest, LeavesPatternsWithOutsideReadersAlone) {
  for (const char* form : {"erf", "tanh", "quick"}) {
    PassRun run = RunConfig(R"({"passes": [{"name": "fuse_gelu"}]})", GeluModel(form, /*leak=*/true));
    ASSERT_TRUE(run.status.ok());
    EXPECT_EQ(run.report.rewrites(), 0) << form;
  }
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

// Runs `model` on token ids with the given attention mask; returns the first output.
std::vector<float> RunEncoder(const onnx::ModelProto& model, const std::vector<int64_t>& ids,
                              const std::vector<int64_t>& mask) {
  auto session = CreateSession({model.SerializeAsString(), {}}, {});
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const int64_t shape[] = {1, static_cast<int64_t>(ids.size())};
  std::vector<int64_t> ids_copy = ids, mask_copy = mask, types(ids.size(), 0);
  Ort::Value inputs[] = {Ort::Value::CreateTensor<int64_t>(memory, ids_copy.data(), ids_copy.size(), shape, 2),
                         Ort::Value::CreateTensor<int64_t>(memory, mask_copy.data(), mask_copy.size(), shape, 2),
                         Ort::Value::CreateTensor<int64_t>(memory, types.data(), types.size(), shape, 2)};
  const char* input_names[] = {"input_ids", "attention_mask", "token_type_ids"};
  const char* output_names[] = {"last_hidden_state"};
  auto outputs = (*session)->Run(Ort::RunOptions{nullptr}, input_names, inputs, 3, output_names, 1);
  const float* data = outputs[0].GetTensorData<float>();
  return std::vector<float>(data, data + outputs[0].GetTensorTypeAndShapeInfo().GetElementCount());
}

TEST(FuseAttentionTest, FusesEveryLayerAndKeepsMaskedOutputs) {
  auto original = LoadModel(testing::FixturePath("bert_tiny.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops["Attention"], 2) << "one per layer";
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_LT(run.model.graph().node_size(), 30);
  // Padding: the last 5 of 12 tokens are masked out, which generated inputs (all ones) never show.
  std::vector<int64_t> ids = {5, 17, 99, 3, 64, 12, 7, 1, 0, 0, 0, 0};
  std::vector<int64_t> mask = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
  const std::vector<float> expected = RunEncoder(*original, ids, mask);
  const std::vector<float> actual = RunEncoder(run.model, ids, mask);
  ASSERT_EQ(expected.size(), actual.size());
  double max_error = 0;
  for (size_t i = 0; i < expected.size(); ++i) max_error = std::max<double>(max_error, std::fabs(expected[i] - actual[i]));
  EXPECT_LT(max_error, 1e-4);
}

}  // namespace
}  // namespace onnxopt

namespace onnxopt {
namespace {

TEST(FuseAttentionTest, FusesGpt2CausalAttentionAndChecksTheBuffer) {
  auto original = LoadModel(testing::FixturePath("gpt2_tiny.onnx"));
  ASSERT_TRUE(original.ok());
  PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  int causal = 0;
  for (const auto& node : run.model.graph().node()) {
    if (node.op_type() != "Attention") continue;
    for (const auto& attribute : node.attribute()) causal += attribute.name() == "unidirectional" && attribute.i() == 1;
  }
  EXPECT_EQ(causal, 2) << "one causal Attention per layer";
  EXPECT_EQ(OpCounts(run.model).count("Softmax"), 0u);
  ExpectSameOutputs(*original, run.model, 1e-5, 1e-4);

  // One entry above the diagonal: no longer causal, so no fusion.
  onnx::ModelProto tampered = *original;
  for (auto& tensor : *tampered.mutable_graph()->mutable_initializer()) {
    if (tensor.name() != "bias") continue;
    ASSERT_TRUE(tensor.has_raw_data());
    (*tensor.mutable_raw_data())[1] = 1;  // row 0, column 1
  }
  PassRun refused = RunConfig(R"({"preset": "transformer"})", tampered);
  ASSERT_TRUE(refused.status.ok());
  EXPECT_EQ(OpCounts(refused.model).count("Attention"), 0u);
  ExpectSameOutputs(tampered, refused.model, 1e-5, 1e-4);
}

}  // namespace
}  // namespace onnxopt
