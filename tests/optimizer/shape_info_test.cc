// Shape inference over models onnx 1.12 only partly knows.
#include <limits>

#include "gtest/gtest.h"
#include "optimizer/passes/rewrite.h"
#include "optimizer/optimize.h"
#include "optimizer/graph.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/constants.h"
#include "optimizer/shape_info.h"
#include "optimizer/shape_inference.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FloatTensor;
using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::WithGraphAttribute;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

// onnx 1.12 crashes the process when it propagates data through Shape-15 from a value whose
// producer it has no schema for and whose type is undeclared (GPT-2 exports at opset 17 after
// fuse_gelu: FastGelu -> Shape -> Reshape target).
TEST(ShapeInfoTest, SurvivesShapeOfAnUntypedContribOutput) {
  onnx::GraphProto graph;
  onnx::NodeProto gelu = MakeNode("FastGelu", {"x"}, {"g"});
  gelu.set_domain("com.microsoft");
  *graph.add_node() = gelu;
  *graph.add_node() = MakeNode("Shape", {"g"}, {"s"});
  *graph.add_node() = MakeNode("Reshape", {"x", "s"}, {"y"});
  *graph.add_input() = FloatValue("x", {-1, 4, 8});
  *graph.add_output() = FloatValue("y", {-1, 4, 8});
  onnx::ModelProto model = MakeModel(graph, 17);
  auto* microsoft = model.add_opset_import();
  microsoft->set_domain("com.microsoft");
  microsoft->set_version(1);
  ShapeInfo shapes = ShapeInfo::Infer(model);
  EXPECT_TRUE(shapes.inferred());
  // Symbolic recovery types the contrib op's output from its input, so Reshape's output is known.
  EXPECT_EQ(shapes.Rank("y"), 3);
  EXPECT_EQ(shapes.Rank("g"), 3);
}

// At an opset past those the sweep reads with onnx 1.12's rules (25), no schema runs, but the shape
// arithmetic of Reshape and Expand targets is still tracked from the declared types: repeat_kv's
// sizes Concat(Shape(x)[0:1], [1], [2], Shape(x)[2:3], [32]) are [batch, 1, 2, sequence, 32].
TEST(ShapeInfoTest, TracksShapeArithmeticAtAnOpsetOnnxDoesNotKnow) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {-1, 1, -1, 32});
  auto* dims = graph.mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  dims->mutable_dim(0)->set_dim_param("batch");
  dims->mutable_dim(2)->set_dim_param("sequence");
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  *graph.add_initializer() = MakeInt64Tensor("two", {2});
  *graph.add_initializer() = MakeInt64Tensor("width", {32});
  *graph.add_node() = WithIntAttribute(WithIntAttribute(MakeNode("Shape", {"x"}, {"b"}), "start", 0), "end", 1);
  *graph.add_node() = WithIntAttribute(WithIntAttribute(MakeNode("Shape", {"x"}, {"s"}), "start", 2), "end", 3);
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"b", "one", "two", "s", "width"}, {"sizes"}), "axis", 0);
  *graph.add_node() = MakeNode("Expand", {"x", "sizes"}, {"y"});
  *graph.add_output() = FloatValue("y", {});
  graph.mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  const onnx::ModelProto model = MakeModel(graph, kLastAdaptedOpset + 1);
  const ShapeInfo shapes = ShapeInfo::Infer(model);
  EXPECT_FALSE(shapes.inferred()) << "no onnx schema ran";
  const auto* sizes = shapes.SymbolicValue("sizes");
  ASSERT_NE(sizes, nullptr);
  ASSERT_EQ(sizes->size(), 5u);
  EXPECT_EQ((*sizes)[0].dim_param(), "batch");
  EXPECT_EQ((*sizes)[2].dim_value(), 2);
  EXPECT_EQ((*sizes)[3].dim_param(), "sequence");
  EXPECT_EQ(shapes.Rank("y"), 5) << "the Expand's output from the tracked sizes";
}

// A fused model 60 layers deep: onnx's inference goes through the contrib operators in one run,
// where restarting it at each fused node gave up after about a dozen layers.
TEST(ShapeInfoTest, ShapesReachTheEndOfADeepFusedModel) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {-1, 0, 8});
  graph.mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
  *graph.add_initializer() = testing::FloatTensor("w", {8, 24}, testing::RandomFloats(8 * 24, 1));
  *graph.add_initializer() = testing::FloatTensor("gamma", {8}, std::vector<float>(8, 1));
  *graph.add_initializer() = testing::FloatTensor("w2", {8, 8}, testing::RandomFloats(64, 2));
  std::string hidden = "x";
  for (int layer = 0; layer < 60; ++layer) {
    const std::string at = std::to_string(layer);
    onnx::NodeProto attention = MakeNode("Attention", {hidden, "w", "", ""}, {"a" + at});
    attention.set_domain("com.microsoft");
    *graph.add_node() = WithIntAttribute(attention, "num_heads", 2);
    onnx::NodeProto skip = MakeNode("SkipLayerNormalization", {"a" + at, hidden, "gamma"}, {"n" + at, "", "", "sum" + at});
    skip.set_domain("com.microsoft");
    *graph.add_node() = skip;
    onnx::NodeProto gelu = MakeNode("FastGelu", {"n" + at}, {"g" + at});
    gelu.set_domain("com.microsoft");
    *graph.add_node() = gelu;
    *graph.add_node() = MakeNode("MatMul", {"g" + at, "w2"}, {"m" + at});  // onnx's to infer
    *graph.add_node() = MakeNode("Add", {"m" + at, "sum" + at}, {"h" + at});
    hidden = "h" + at;
  }
  *graph.add_output() = FloatValue(hidden, {-1, 0, 8});
  graph.mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
  onnx::ModelProto model = MakeModel(graph, 17);
  auto* microsoft = model.add_opset_import();
  microsoft->set_domain("com.microsoft");
  microsoft->set_version(1);
  ShapeInfo shapes = ShapeInfo::Infer(model);
  ASSERT_TRUE(shapes.inferred());
  ASSERT_EQ(shapes.Rank("m59"), 3);  // the last layer's values (the output's shape is declared)
  EXPECT_EQ(shapes.Dim("m59", 1)->dim_param(), "sequence");
  EXPECT_EQ(shapes.DimValue("m59", 2), 8);
  EXPECT_EQ(shapes.DimValue("sum59", 2), 8);
  // The schemas are permissive: the checker takes the operators as ONNX Runtime does, optional
  // inputs and outputs left out.
  std::vector<std::string> warnings;
  absl::Status checked = CheckModel(model, &warnings);
  EXPECT_TRUE(checked.ok()) << checked;
}

// 40 blocks of export-style reshapes, each target computed from the Shape of the block's input with
// a -1 onnx cannot solve over symbolic dims: [batch, sequence, 8] -> [batch, sequence, 4, -1] ->
// [0, 0, -1]. Each block needs the previous block's recovered shape. Recovery in rounds (the
// recovered shapes written back and onnx's inference run again) went one block deeper a round and
// stopped at 32; the sweep sees every node's inputs final, so one run reaches the end.
TEST(ShapeInfoTest, ComputedReshapesResolveInOneSweepAtAnyDepth) {
  constexpr int kBlocks = 40;
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {-1, 0, 8});
  graph.mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
  *graph.add_initializer() = MakeInt64Tensor("zero", {0});
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  *graph.add_initializer() = MakeInt64Tensor("four_rest", {4, -1});
  *graph.add_initializer() = MakeInt64Tensor("keep_two_rest", {0, 0, -1});
  std::string hidden = "x";
  for (int block = 0; block < kBlocks; ++block) {
    const std::string at = std::to_string(block);
    *graph.add_node() = MakeNode("Shape", {hidden}, {"shape" + at});
    *graph.add_node() = MakeNode("Gather", {"shape" + at, "zero"}, {"batch" + at});
    *graph.add_node() = MakeNode("Gather", {"shape" + at, "one"}, {"sequence" + at});
    *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"batch" + at, "sequence" + at, "four_rest"}, {"split_to" + at}), "axis", 0);
    *graph.add_node() = MakeNode("Reshape", {hidden, "split_to" + at}, {"heads" + at});
    *graph.add_node() = MakeNode("Reshape", {"heads" + at, "keep_two_rest"}, {"merged" + at});
    *graph.add_node() = MakeNode("Relu", {"merged" + at}, {"h" + at});
    hidden = "h" + at;
  }
  *graph.add_output() = FloatValue(hidden, {});
  graph.mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  ShapeInfo shapes = ShapeInfo::Infer(MakeModel(graph, 17));
  ASSERT_TRUE(shapes.inferred());
  const std::string last = std::to_string(kBlocks - 1);
  ASSERT_EQ(shapes.Rank("heads" + last), 4);
  EXPECT_EQ(shapes.Dim("heads" + last, 1)->dim_param(), "sequence");
  EXPECT_EQ(shapes.DimValue("heads" + last, 3), 2);
  ASSERT_EQ(shapes.Rank(hidden), 3);
  EXPECT_EQ(shapes.Dim(hidden, 0)->dim_param(), "batch");
  EXPECT_EQ(shapes.DimValue(hidden, 2), 8);
  // The computed target is known symbolically, element by element.
  const auto* target = shapes.SymbolicValue("split_to" + last);
  ASSERT_NE(target, nullptr);
  ASSERT_EQ(target->size(), 4u);
  EXPECT_EQ((*target)[1].dim_param(), "sequence");
  EXPECT_EQ((*target)[3].dim_value(), -1);
}

// A declared shape that contradicts inference costs that node's outputs, not the model's shapes:
// onnx's InferShapes throws on the clash (even in its lenient mode) and gave nothing at all.
TEST(ShapeInfoTest, AClashWithADeclaredShapeLosesOneNodeNotTheModel) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_node() = MakeNode("Relu", {"x"}, {"r"});
  *graph.add_value_info() = FloatValue("r", {5, 5});  // wrong
  *graph.add_node() = MakeNode("Sigmoid", {"x"}, {"s"});
  *graph.add_node() = MakeNode("Transpose", {"s"}, {"t"});
  *graph.add_output() = FloatValue("t", {});
  graph.mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  ShapeInfo shapes = ShapeInfo::Infer(MakeModel(graph, 17));
  ASSERT_TRUE(shapes.inferred());
  EXPECT_EQ(shapes.StaticShape("t"), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(shapes.StaticShape("r"), (std::vector<int64_t>{5, 5}));  // as declared
}

TEST(ShapeInfoTest, ForgottenValuesHaveNoTypeOrValue) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 3});
  *graph.add_node() = MakeNode("Shape", {"x"}, {"s"});
  *graph.add_node() = MakeNode("Relu", {"x"}, {"r"});
  *graph.add_output() = FloatValue("r", {2, 3});
  ShapeInfo shapes = ShapeInfo::Infer(MakeModel(graph, 17));
  ASSERT_TRUE(shapes.KnownValue("s").has_value());
  shapes.Forget({"s", "r"});
  EXPECT_EQ(shapes.TypeOf("s"), nullptr);
  EXPECT_FALSE(shapes.KnownValue("s").has_value());
  EXPECT_EQ(shapes.TypeOf("r"), nullptr);
  EXPECT_EQ(shapes.StaticShape("x"), (std::vector<int64_t>{2, 3}));
}

// After a pass that keeps the types of what it left, the nodes it added are typed from their inputs
// without a new inference of the graph (chained: an added node reads another's output).
TEST(ShapeInfoTest, ExtendTypesTheNodesAPassAdded) {
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("x", {2, 3});
  *proto.add_node() = MakeNode("Relu", {"x"}, {"r"});
  *proto.add_output() = FloatValue("r", {});
  proto.mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  onnx::ModelProto model = MakeModel(proto, 17);
  Graph graph(model.mutable_graph());
  ShapeInfo shapes = ShapeInfo::Infer(model, graph);
  ASSERT_EQ(shapes.StaticShape("r"), (std::vector<int64_t>{2, 3}));
  Node* relu = graph.Producer("r");
  Node* transpose = graph.AddNode(MakeNode("Transpose", {"r"}, {"t"}), relu, /*after=*/true);
  graph.AddNode(MakeNode("Sigmoid", {"t"}, {"s"}), transpose, /*after=*/true);
  ASSERT_TRUE(graph.Checkpoint().ok());
  EXPECT_EQ(shapes.TypeOf("s"), nullptr);
  shapes.Extend(model, graph, graph.TakeAddedNodes(), graph.TakeAddedInitializers());
  EXPECT_EQ(shapes.StaticShape("t"), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(shapes.StaticShape("s"), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(shapes.StaticShape("r"), (std::vector<int64_t>{2, 3}));
  ASSERT_TRUE(graph.Commit().ok());
}

// Extend types only the initializers a pass added or replaced (not every initializer again); one
// that an existing node is rewired to is typed although no node was added.
TEST(ShapeInfoTest, ExtendTypesTheInitializersAPassAddedOrReplaced) {
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("x", {2, 3});
  *proto.add_initializer() = FloatTensor("b", {3}, {1, 1, 1});
  *proto.add_node() = MakeNode("Add", {"x", "b"}, {"y"});
  *proto.add_output() = FloatValue("y", {2, 3});
  onnx::ModelProto model = MakeModel(proto, 17);
  Graph graph(model.mutable_graph());
  ShapeInfo shapes = ShapeInfo::Infer(model, graph);
  ASSERT_EQ(shapes.StaticShape("b"), (std::vector<int64_t>{3}));
  graph.AddInitializer(FloatTensor("c", {2, 3}, std::vector<float>(6, 1)));
  graph.SetInput(graph.Producer("y"), 1, "c");
  graph.ReplaceInitializer(FloatTensor("b", {4}, {1, 1, 1, 1}));
  ASSERT_TRUE(graph.Checkpoint().ok());
  EXPECT_EQ(shapes.TypeOf("c"), nullptr);
  shapes.Forget(graph.TakeVanishedValues());
  shapes.Extend(model, graph, graph.TakeAddedNodes(), graph.TakeAddedInitializers());
  EXPECT_EQ(shapes.StaticShape("c"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shapes.StaticShape("b"), (std::vector<int64_t>{4}));
  EXPECT_EQ(shapes.StaticShape("y"), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(graph.TakeAddedInitializers().empty());
  ASSERT_TRUE(graph.Commit().ok());
}

// While a Graph holds an If's branches, their node lists in the model are empty: inference must see
// the live bodies, and find what onnx's InferShapes finds on the model itself.
TEST(ShapeInfoTest, AHeldGraphInfersThroughItsBranches) {
  auto branch = [](const std::string& name, const std::string& op) {
    onnx::GraphProto body;
    body.set_name(name);
    *body.add_node() = MakeNode(op, {"x"}, {name + "_out"});
    onnx::ValueInfoProto out;
    out.set_name(name + "_out");
    out.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);  // no shape
    *body.add_output() = out;
    return body;
  };
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("x", {2, 3});
  *proto.add_initializer() = testing::BoolScalar("condition", true);
  *proto.add_node() = WithGraphAttribute(
      WithGraphAttribute(MakeNode("If", {"condition"}, {"y"}), "then_branch", branch("then", "Relu")), "else_branch",
      branch("else", "Neg"));
  *proto.add_node() = MakeNode("Transpose", {"y"}, {"t"});
  *proto.add_output() = FloatValue("t", {});
  proto.mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  onnx::ModelProto model = MakeModel(proto, 17);
  const ShapeInfo from_model = ShapeInfo::Infer(model);
  ASSERT_EQ(from_model.StaticShape("t"), (std::vector<int64_t>{3, 2}));
  Graph graph(model.mutable_graph());
  const ShapeInfo held = ShapeInfo::Infer(model, graph);
  EXPECT_EQ(held.StaticShape("y"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(held.StaticShape("t"), (std::vector<int64_t>{3, 2}));
  ASSERT_TRUE(graph.Commit().ok());
}

// A node calling a model-local function is typed through the function's body, whose names may also
// be the outer graph's.
TEST(ShapeInfoTest, ModelLocalFunctionsAreInferredThroughTheirBodies) {
  onnx::GraphProto proto;
  *proto.add_input() = FloatValue("x", {2, 3});
  *proto.add_node() = MakeNode("Shape", {"x"}, {"t"});  // a name the body uses too
  *proto.add_node() = MakeNode("Relu", {"x"}, {"r"});
  onnx::NodeProto call = MakeNode("TransposeTwice", {"r"}, {"y"});
  call.set_domain("local");
  *proto.add_node() = call;
  *proto.add_output() = FloatValue("y", {});
  proto.mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  onnx::ModelProto model = MakeModel(proto, 17);
  auto* import = model.add_opset_import();
  import->set_domain("local");
  import->set_version(1);
  onnx::FunctionProto* function = model.add_functions();
  function->set_name("TransposeTwice");
  function->set_domain("local");
  function->add_input("in");
  function->add_output("out");
  *function->add_opset_import() = model.opset_import(0);
  *function->add_node() = MakeNode("Transpose", {"in"}, {"t"});
  *function->add_node() = MakeNode("Transpose", {"t"}, {"out"});
  const ShapeInfo shapes = ShapeInfo::Infer(model);
  EXPECT_EQ(shapes.StaticShape("y"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(shapes.StaticShape("t"), (std::vector<int64_t>{2}));
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

// Before opset 10 a Slice's bounds are attributes (paddle2onnx writes opset 9): a slice of a shape is
// tracked as at later opsets, so a Reshape to Concat(Shape(x)[0:2], [-1]) gets its rank and dims.
TEST(ShapeInfoTest, TracksAShapeSlicedByAttributesAtOpsetNine) {
  onnx::GraphProto graph;
  onnx::ValueInfoProto x = FloatValue("x", {2, 8, 3, 5});
  x.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("batch");
  *graph.add_input() = x;
  *graph.add_initializer() = MakeInt64Tensor("minus_one", {-1});
  *graph.add_node() = MakeNode("Shape", {"x"}, {"shape"});
  onnx::NodeProto slice = MakeNode("Slice", {"shape"}, {"lead"});
  *slice.add_attribute() = MakeIntsAttribute("starts", {0});
  *slice.add_attribute() = MakeIntsAttribute("ends", {2});
  *slice.add_attribute() = MakeIntsAttribute("axes", {0});
  *graph.add_node() = slice;
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"lead", "minus_one"}, {"target"}), "axis", 0);
  *graph.add_node() = MakeNode("Reshape", {"x", "target"}, {"flat"});
  onnx::ValueInfoProto flat = FloatValue("flat", {});
  flat.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = flat;
  ShapeInfo info = ShapeInfo::Infer(MakeModel(graph, 9));
  const onnx::TypeProto* type = info.TypeOf("flat");
  ASSERT_NE(type, nullptr);
  ASSERT_EQ(type->tensor_type().shape().dim_size(), 3);
  EXPECT_EQ(type->tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(type->tensor_type().shape().dim(1).dim_value(), 8);
  EXPECT_EQ(type->tensor_type().shape().dim(2).dim_value(), 15);
}

// PP-OCRv4's recognizer flattens convolution features whose sizes onnx cannot work out ([B, C, ?, ?]
// to [B, C, -1]): the dim -1 leaves gets a name, so the sequence that follows is one dim everywhere
// (a residual Add's operands, Shape reads of either).
TEST(ShapeInfoTest, AFlatteningReshapeOfUnknownDimsNamesTheDimItLeaves) {
  onnx::GraphProto graph;
  onnx::ValueInfoProto x = FloatValue("x", {2, 8, 3, 5});
  auto* dims = x.mutable_type()->mutable_tensor_type()->mutable_shape();
  dims->mutable_dim(0)->set_dim_param("batch");
  dims->mutable_dim(2)->clear_dim_value();
  dims->mutable_dim(3)->clear_dim_value();
  *graph.add_input() = x;
  *graph.add_initializer() = MakeInt64Tensor("target", {0, 8, -1});
  *graph.add_node() = MakeNode("Reshape", {"x", "target"}, {"flat"});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"flat"}, {"sequence"}), "perm", {0, 2, 1});
  *graph.add_node() = MakeNode("Relu", {"sequence"}, {"branch"});
  *graph.add_node() = MakeNode("Add", {"sequence", "branch"}, {"y"});
  onnx::ValueInfoProto y = FloatValue("y", {});
  y.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = y;
  ShapeInfo info = ShapeInfo::Infer(MakeModel(graph, 13));
  const auto* named = info.Dim("flat", 2);
  ASSERT_NE(named, nullptr);
  EXPECT_FALSE(named->dim_param().empty());
  EXPECT_TRUE(info.SameDim("sequence", 1, "flat", 2));
  EXPECT_TRUE(info.SameShape("y", "sequence"));
  EXPECT_TRUE(info.SameDim("y", 0, "x", 0));
}

// ESPnet's relative positions: a table of 2M - 1 rows cut to pe[:, c - T + 1 : c + T] (T from Shape), so
// the positions are 2*T - 1; rel_shift's `[..., : x.size(-1) // 2 + 1]` of them is T again; `[:, 1:]` of
// [.., 2*T] is 2*T - 1.
TEST(ShapeInfoTest, SlicesBySymbolicBoundsCountTheirLengths) {
  onnx::GraphProto graph;
  onnx::ValueInfoProto x = FloatValue("x", {1, 8, 4});
  x.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("T");
  *graph.add_input() = x;
  *graph.add_initializer() = FloatTensor("pe", {1, 99, 4}, std::vector<float>(99 * 4, 0.5f));
  *graph.add_initializer() = MakeInt64Tensor("one_index", {1});
  *graph.add_initializer() = MakeInt64Tensor("center", {49});
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  *graph.add_initializer() = MakeInt64Tensor("two", {2});
  *graph.add_initializer() = MakeInt64Tensor("axis1", {1});
  *graph.add_initializer() = MakeInt64Tensor("last", {-1});
  *graph.add_initializer() = MakeInt64Tensor("zero", {0});
  *graph.add_initializer() = MakeInt64Tensor("big", {std::numeric_limits<int64_t>::max()});
  *graph.add_node() = MakeNode("Shape", {"x"}, {"shape"});
  *graph.add_node() = MakeNode("Gather", {"shape", "one_index"}, {"t"});
  *graph.add_node() = MakeNode("Sub", {"center", "t"}, {"c_minus_t"});
  *graph.add_node() = MakeNode("Add", {"c_minus_t", "one"}, {"start"});
  *graph.add_node() = MakeNode("Add", {"center", "t"}, {"end"});
  *graph.add_node() = MakeNode("Slice", {"pe", "start", "end", "axis1"}, {"positions"});
  // (2T - 1) // 2 + 1 = T on the positions' own length.
  *graph.add_node() = MakeNode("Shape", {"positions"}, {"positions_shape"});
  *graph.add_node() = MakeNode("Gather", {"positions_shape", "one_index"}, {"length"});
  *graph.add_node() = MakeNode("Div", {"length", "two"}, {"half"});
  *graph.add_node() = MakeNode("Add", {"half", "one"}, {"kept"});
  *graph.add_node() = MakeNode("Slice", {"positions", "zero", "kept", "axis1"}, {"shifted"});
  // [:, 1:] of Concat(positions, x-like [1, 1, 4]) [1, 2T, 4].
  *graph.add_node() = MakeNode("Slice", {"x", "zero", "one", "axis1"}, {"x_row"});
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"positions", "x_row"}, {"padded"}), "axis", 1);
  *graph.add_node() = MakeNode("Slice", {"padded", "one", "big", "axis1"}, {"dropped"});
  // On the symbolic T itself: [:, 1:] is T - 1, [:, :5] unknown (5 may be past T).
  *graph.add_initializer() = MakeInt64Tensor("five", {5});
  *graph.add_node() = MakeNode("Slice", {"x", "one", "big", "axis1"}, {"tail"});
  *graph.add_node() = MakeNode("Slice", {"x", "zero", "five", "axis1"}, {"head"});
  for (const char* name : {"shifted", "dropped", "tail", "head"}) {
    onnx::ValueInfoProto out = FloatValue(name, {});
    out.mutable_type()->mutable_tensor_type()->clear_shape();
    *graph.add_output() = out;
  }
  ShapeInfo info = ShapeInfo::Infer(MakeModel(graph, 13));
  ASSERT_NE(info.Dim("positions", 1), nullptr);
  EXPECT_EQ(info.Dim("positions", 1)->dim_param(), "2*T - 1");
  EXPECT_TRUE(info.SameDim("shifted", 1, "x", 1));
  ASSERT_NE(info.Dim("dropped", 1), nullptr);
  EXPECT_EQ(info.Dim("dropped", 1)->dim_param(), "2*T - 1");
  ASSERT_NE(info.Dim("tail", 1), nullptr);
  EXPECT_EQ(info.Dim("tail", 1)->dim_param(), "T - 1");
  const auto* head = info.Dim("head", 1);
  EXPECT_TRUE(head == nullptr || (!head->has_dim_value() && head->dim_param().empty()));
}

// Opset 18 (what the dynamo exporter and ONNX Runtime's BART test write, here without any value_info):
// unchanged operators get their opset-17 rules, ReduceMean with its axes as an input ReduceSum-13's,
// Split by num_outputs Split-13's even split; a Pad with an axes input (new at 18) gets none, and its
// output stays untyped rather than wrongly shaped.
TEST(ShapeInfoTest, OpsetEighteenReadsTheRulesThatStillHold) {
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 6, 8});
  *graph.add_initializer() = MakeInt64Tensor("last", {-1});
  *graph.add_initializer() = MakeInt64Tensor("pads", {1, 1});
  *graph.add_initializer() = MakeInt64Tensor("pad_axes", {2});
  *graph.add_node() = MakeNode("ReduceMean", {"x", "last"}, {"mean"});
  *graph.add_node() = MakeNode("Sub", {"x", "mean"}, {"centered"});
  *graph.add_node() = WithIntAttribute(WithIntAttribute(MakeNode("Split", {"centered"}, {"a", "b"}), "axis", 1),
                                       "num_outputs", 2);
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"b"}, {"b_t"}), "perm", {0, 2, 1});
  *graph.add_node() = MakeNode("MatMul", {"a", "b_t"}, {"scores"});
  *graph.add_node() = MakeNode("Pad", {"x", "pads", "", "pad_axes"}, {"padded"});
  *graph.add_output() = FloatValue("scores", {});
  *graph.add_output() = FloatValue("padded", {});
  for (int i = 0; i < 2; ++i) graph.mutable_output(i)->mutable_type()->mutable_tensor_type()->clear_shape();
  const onnx::ModelProto model = MakeModel(graph, 18);
  const ShapeInfo shapes = ShapeInfo::Infer(model);
  EXPECT_TRUE(shapes.inferred());
  EXPECT_EQ(shapes.StaticShape("mean"), (std::vector<int64_t>{2, 6, 1}));
  EXPECT_EQ(shapes.StaticShape("a"), (std::vector<int64_t>{2, 3, 8}));
  EXPECT_EQ(shapes.StaticShape("scores"), (std::vector<int64_t>{2, 3, 3}));
  EXPECT_FALSE(shapes.StaticShape("padded").has_value()) << "Pad-18's axes: opset 17's rule would pad every axis";
}

}  // namespace
}  // namespace onnxopt
