// Shape inference over models onnx 1.12 only partly knows.
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace onnxopt
