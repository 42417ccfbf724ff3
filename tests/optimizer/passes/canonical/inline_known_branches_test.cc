// inline_known_branches: the TorchScript exporter's If(Shape(t)[d] == 1, Squeeze(t, d), Identity(t))
// becomes the Squeeze where the dim is known to be 1, the Identity where it is known not to be, and
// stays where it is not known; the outputs are the same in ONNX Runtime.
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

// t [2, dim1, 3] (dim1 a number or the named "n") -> y = t.squeeze(1) as torch 1.13 exports it on a
// dim it cannot see, then y * 2.
onnx::ModelProto SqueezeOfAnUnseenDim(const onnx::TensorShapeProto::Dimension& dim1) {
  onnx::GraphProto graph;
  onnx::ValueInfoProto t = FloatValue("t", {2, 1, 3});
  *t.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1) = dim1;
  *graph.add_input() = t;
  *graph.add_initializer() = MakeIntScalar("one_index", onnx::TensorProto::INT64, 1);
  *graph.add_initializer() = MakeIntScalar("one", onnx::TensorProto::INT64, 1);
  *graph.add_initializer() = MakeFloatTensor("two", {}, {2.0f});
  *graph.add_node() = MakeNode("Shape", {"t"}, {"shape"});
  *graph.add_node() = MakeNode("Gather", {"shape", "one_index"}, {"dim"});
  *graph.add_node() = MakeNode("Equal", {"dim", "one"}, {"is_one"});
  onnx::NodeProto branch_if = MakeNode("If", {"is_one"}, {"y"});
  onnx::AttributeProto* then_branch = branch_if.add_attribute();
  then_branch->set_name("then_branch");
  then_branch->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* squeeze = then_branch->mutable_g();
  squeeze->set_name("then");
  *squeeze->add_node() = MakeNode("Constant", {}, {"axes"});
  onnx::AttributeProto* value = squeeze->mutable_node(0)->add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  *value->mutable_t() = MakeInt64Tensor("axes", {1});
  *squeeze->add_node() = MakeNode("Squeeze", {"t", "axes"}, {"squeezed"});
  *squeeze->add_output() = FloatValue("squeezed", {});
  squeeze->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  onnx::AttributeProto* else_branch = branch_if.add_attribute();
  else_branch->set_name("else_branch");
  else_branch->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* identity = else_branch->mutable_g();
  identity->set_name("else");
  *identity->add_node() = MakeNode("Identity", {"t"}, {"kept"});
  *identity->add_output() = FloatValue("kept", {});
  identity->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_node() = branch_if;
  *graph.add_node() = MakeNode("Mul", {"y", "two"}, {"out"});
  onnx::ValueInfoProto out = FloatValue("out", {});
  out.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = out;
  return MakeModel(graph, 14);
}

onnx::TensorShapeProto::Dimension Dim(int64_t value) {
  onnx::TensorShapeProto::Dimension dim;
  dim.set_dim_value(value);
  return dim;
}

constexpr char kPipeline[] = R"({"passes": [{"name": "inline_known_branches"}, {"name": "eliminate_identity"},
                                            {"name": "eliminate_dead_nodes"}]})";

TEST(InlineKnownBranchesTest, AStaticDimOfOneTakesTheSqueeze) {
  const onnx::ModelProto original = SqueezeOfAnUnseenDim(Dim(1));
  PassRun run = RunConfig(kPipeline, original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("If"), 0u);
  EXPECT_EQ(ops["Squeeze"], 1);
  ExpectSameOutputs(original, run.model, 0, 0);

  // Alone, the pass already leaves no Identity: the Squeeze writes the If's output, so the fusions of
  // the same sweep see the value's producer.
  PassRun alone = RunConfig(R"({"passes": [{"name": "inline_known_branches"}]})", original);
  ASSERT_TRUE(alone.status.ok()) << alone.status;
  EXPECT_EQ(OpCounts(alone.model).count("Identity"), 0u);
  bool squeeze_writes_y = false;
  for (const auto& node : alone.model.graph().node()) squeeze_writes_y |= node.op_type() == "Squeeze" && node.output(0) == "y";
  EXPECT_TRUE(squeeze_writes_y);
}

// (ONNX Runtime refuses the original here: it infers the branch not taken too.)
TEST(InlineKnownBranchesTest, AStaticDimOfTwoKeepsTheTensorAndAnUnknownDimKeepsTheIf) {
  PassRun run = RunConfig(kPipeline, SqueezeOfAnUnseenDim(Dim(2)));
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("If"), 0u);
  EXPECT_EQ(ops.count("Squeeze"), 0u);
  EXPECT_EQ(ops["Mul"], 1);

  onnx::TensorShapeProto::Dimension named;
  named.set_dim_param("n");
  PassRun unknown = testing::RunPass("inline_known_branches", SqueezeOfAnUnseenDim(named));
  ASSERT_TRUE(unknown.status.ok()) << unknown.status;
  EXPECT_EQ(unknown.report.rewrites(), 0);
}

}  // namespace
}  // namespace onnxopt
