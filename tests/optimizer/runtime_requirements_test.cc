#include "optimizer/runtime_requirements.h"

#include "gtest/gtest.h"

namespace onnxopt {
namespace {

onnx::ModelProto WithOps(int opset, const std::vector<std::string>& microsoft_ops) {
  onnx::ModelProto model;
  model.add_opset_import()->set_version(opset);
  for (const std::string& op : microsoft_ops) {
    onnx::NodeProto* node = model.mutable_graph()->add_node();
    node->set_op_type(op);
    node->set_domain("com.microsoft");
  }
  return model;
}

TEST(RuntimeRequirementsTest, StandardOperatorsNeedTheReleaseThatImplementsTheOpset) {
  RuntimeRequirement needs = MinimumOnnxRuntime(WithOps(18, {}), /*cuda=*/false);
  EXPECT_EQ(needs.version, "1.14");
  EXPECT_EQ(needs.reason, "opset 18");
  EXPECT_FALSE(needs.contrib);
  EXPECT_EQ(MinimumOnnxRuntime(WithOps(13, {}), false).version, "1.10") << "the floor";
}

TEST(RuntimeRequirementsTest, ContribKernelsDifferByProvider) {
  // MultiHeadAttention shipped on CUDA in 1.14, its CPU kernel one release later.
  EXPECT_EQ(MinimumOnnxRuntime(WithOps(17, {"MultiHeadAttention"}), true).version, "1.14");
  RuntimeRequirement cpu = MinimumOnnxRuntime(WithOps(17, {"MultiHeadAttention", "MatMulNBits"}), false);
  EXPECT_EQ(cpu.version, "1.16.2");
  EXPECT_EQ(cpu.reason, "com.microsoft::MatMulNBits");
  EXPECT_TRUE(cpu.contrib);
  // No CPU kernel in any release: nothing to pin, and said so.
  RuntimeRequirement packed = MinimumOnnxRuntime(WithOps(17, {"PackedAttention", "MatMulNBits"}), false);
  EXPECT_TRUE(packed.version.empty());
  EXPECT_NE(packed.reason.find("PackedAttention has no CPU kernel"), std::string::npos) << packed.reason;
  EXPECT_EQ(MinimumOnnxRuntime(WithOps(17, {"PackedAttention"}), true).version, "1.15");
}

TEST(RuntimeRequirementsTest, GroupQueryAttentionsLaterAttributesRaiseTheRelease) {
  onnx::ModelProto model = WithOps(17, {"GroupQueryAttention"});
  EXPECT_EQ(MinimumOnnxRuntime(model, true).version, "1.16.2");
  EXPECT_EQ(MinimumOnnxRuntime(model, false).version, "1.18") << "float on the CPU";
  onnx::NodeProto* node = model.mutable_graph()->mutable_node(0);
  node->add_attribute()->set_name("do_rotary");
  for (int i = 0; i < 9; ++i) node->add_input("x");
  EXPECT_EQ(MinimumOnnxRuntime(model, true).version, "1.17");
  node->add_attribute()->set_name("softcap");
  EXPECT_EQ(MinimumOnnxRuntime(model, true).version, "1.20");
}

TEST(RuntimeRequirementsTest, AnOpsetNewerThanTheTableClaimsNoRelease) {
  RuntimeRequirement needs = MinimumOnnxRuntime(WithOps(40, {}), false);
  EXPECT_TRUE(needs.version.empty());
  EXPECT_NE(needs.reason.find("opset 40 is newer"), std::string::npos) << needs.reason;
}

TEST(RuntimeRequirementsTest, SubgraphsCount) {
  onnx::ModelProto model = WithOps(17, {});
  onnx::NodeProto* branch = model.mutable_graph()->add_node();
  branch->set_op_type("If");
  onnx::AttributeProto* then_branch = branch->add_attribute();
  then_branch->set_name("then_branch");
  onnx::NodeProto* inner = then_branch->mutable_g()->add_node();
  inner->set_op_type("RotaryEmbedding");
  inner->set_domain("com.microsoft");
  EXPECT_EQ(MinimumOnnxRuntime(model, false).version, "1.16.2");
}

}  // namespace
}  // namespace onnxopt
