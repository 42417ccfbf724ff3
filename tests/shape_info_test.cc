// Shape inference over models onnx 1.12 only partly knows.
#include "gtest/gtest.h"
#include "optimizer/optimize.h"
#include "optimizer/shape_info.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;

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
    *graph.add_node() = testing::WithIntAttribute(attention, "num_heads", 2);
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

}  // namespace
}  // namespace onnxopt
