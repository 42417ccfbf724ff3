// What a boolean attention mask means, read by probing it in ONNX Runtime: all true, a key-padding
// mask of one [B, T] input, causal, causal with padding, or something else that the fusions must not
// take for one of these.
#include "optimizer/passes/fusion/attention_masks.h"

#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::MakeModel;
using testing::MakeNode;

onnx::ValueInfoProto MaskInput(const std::string& name) {
  onnx::ValueInfoProto value = testing::MakeValue(name, onnx::TensorProto::INT64, {-1, 0});
  value.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("sequence");
  return value;
}

MaskMeaning Probe(const onnx::GraphProto& graph_proto, const std::string& mask, bool additive = false) {
  onnx::ModelProto model = MakeModel(graph_proto, 17);
  Graph graph(model.mutable_graph());
  PassContext context(PassParams(), model);
  return ProbeMaskMeaning(graph, context, mask, additive);
}

TEST(AttentionMaskTest, KeyPaddingFromTheAttentionMaskInput) {
  onnx::GraphProto graph;
  *graph.add_input() = MaskInput("input_ids");
  *graph.add_input() = MaskInput("attention_mask");
  *graph.add_initializer() = MakeInt64Tensor("axes", {1, 2});
  *graph.add_node() = testing::WithIntAttribute(MakeNode("Cast", {"attention_mask"}, {"bool_mask"}), "to",
                                                onnx::TensorProto::BOOL);
  *graph.add_node() = MakeNode("Unsqueeze", {"bool_mask", "axes"}, {"mask4d"});
  MaskMeaning meaning = Probe(graph, "mask4d");
  EXPECT_EQ(meaning.kind, MaskMeaning::Kind::kKeyPadding) << meaning.why;
  EXPECT_EQ(meaning.padding_input, "attention_mask");
}

TEST(AttentionMaskTest, AllTrueCausalAndOtherMasks) {
  onnx::GraphProto graph;
  *graph.add_input() = MaskInput("attention_mask");
  *graph.add_initializer() = testing::BoolScalar("yes", true);
  *graph.add_initializer() = MakeInt64Tensor("zero", {0});
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  *graph.add_node() = MakeNode("Shape", {"attention_mask"}, {"shape"});
  *graph.add_node() = MakeNode("Gather", {"shape", "one"}, {"length"});
  *graph.add_node() = MakeNode("Gather", {"shape", "zero"}, {"batch"});
  *graph.add_node() = MakeNode("Concat", {"batch", "one", "length", "length"}, {"mask_shape"});
  graph.mutable_node(3)->add_attribute()->set_name("axis");
  graph.mutable_node(3)->mutable_attribute(0)->set_type(onnx::AttributeProto::INT);
  *graph.add_node() = MakeNode("Expand", {"yes", "mask_shape"}, {"everywhere"});
  MaskMeaning all = Probe(graph, "everywhere");
  EXPECT_EQ(all.kind, MaskMeaning::Kind::kAllTrue) << all.why;

  // Causal: t <= q, from Ranges over the length.
  *graph.add_initializer() = MakeInt64Tensor("axes_q", {0, 1, 3});
  *graph.add_initializer() = MakeInt64Tensor("axes_t", {0, 1, 2});
  onnx::TensorProto zero_scalar = MakeInt64Tensor("zero_scalar", {0});
  zero_scalar.clear_dims();
  onnx::TensorProto one_scalar = MakeInt64Tensor("one_scalar", {1});
  one_scalar.clear_dims();
  *graph.add_initializer() = zero_scalar;
  *graph.add_initializer() = one_scalar;
  *graph.add_node() = MakeNode("Squeeze", {"length", "zero"}, {"length_scalar"});
  *graph.add_node() = MakeNode("Range", {"zero_scalar", "length_scalar", "one_scalar"}, {"positions"});
  *graph.add_node() = MakeNode("Unsqueeze", {"positions", "axes_q"}, {"q"});
  *graph.add_node() = MakeNode("Unsqueeze", {"positions", "axes_t"}, {"t"});
  *graph.add_node() = MakeNode("LessOrEqual", {"t", "q"}, {"causal"});
  *graph.add_node() = MakeNode("And", {"causal", "everywhere"}, {"causal_mask"});
  MaskMeaning causal = Probe(graph, "causal_mask");
  EXPECT_EQ(causal.kind, MaskMeaning::Kind::kCausal) << causal.why;

  // Causal and padded: a decoder's batch.
  *graph.add_node() = testing::WithIntAttribute(MakeNode("Cast", {"attention_mask"}, {"bool_mask"}), "to",
                                                onnx::TensorProto::BOOL);
  *graph.add_initializer() = MakeInt64Tensor("axes_mask", {1, 2});
  *graph.add_node() = MakeNode("Unsqueeze", {"bool_mask", "axes_mask"}, {"padding"});
  *graph.add_node() = MakeNode("And", {"causal_mask", "padding"}, {"decoder_mask"});
  MaskMeaning decoder = Probe(graph, "decoder_mask");
  EXPECT_EQ(decoder.kind, MaskMeaning::Kind::kCausalKeyPadding) << decoder.why;
  EXPECT_EQ(decoder.padding_input, "attention_mask");

  // A sliding window wider than the default probe lengths (64 positions back) is probed past its
  // width: not taken for causal, but for the window it is.
  *graph.add_initializer() = MakeInt64Tensor("window", {64});
  *graph.add_node() = MakeNode("Sub", {"q", "t"}, {"distance"});
  *graph.add_node() = MakeNode("Less", {"distance", "window"}, {"near"});
  *graph.add_node() = MakeNode("And", {"causal_mask", "near"}, {"window_mask"});
  MaskMeaning window = Probe(graph, "window_mask");
  EXPECT_EQ(window.kind, MaskMeaning::Kind::kSlidingWindow) << window.why;
  EXPECT_EQ(window.window, 64);
  EXPECT_TRUE(window.within_causal);
  // With padding, and spelled distance <= 64: a window of 65.
  *graph.add_node() = MakeNode("LessOrEqual", {"distance", "window"}, {"near_or_at"});
  *graph.add_node() = MakeNode("And", {"causal_mask", "near_or_at"}, {"wider_mask"});
  *graph.add_node() = MakeNode("And", {"wider_mask", "padding"}, {"padded_window_mask"});
  MaskMeaning padded_window = Probe(graph, "padded_window_mask");
  EXPECT_EQ(padded_window.kind, MaskMeaning::Kind::kSlidingWindowKeyPadding) << padded_window.why;
  EXPECT_EQ(padded_window.window, 65);
  EXPECT_EQ(padded_window.padding_input, "attention_mask");

  // Anything else (here: each position sees only itself and later ones) is not taken for one of these.
  *graph.add_node() = MakeNode("GreaterOrEqual", {"t", "q"}, {"later"});
  *graph.add_node() = MakeNode("And", {"later", "everywhere"}, {"later_mask"});
  MaskMeaning later = Probe(graph, "later_mask");
  EXPECT_EQ(later.kind, MaskMeaning::Kind::kUnknown);
  EXPECT_NE(later.why.find("not all true, causal"), std::string::npos) << later.why;
}

// The float mask older transformers add, (1 - mask[:, None, None, :]) * finfo.min, read as the boolean
// mask of its zeros: key padding of attention_mask. A float term holding other values (a position bias)
// is no mask.
TEST(AttentionMaskTest, AnAdditiveFloatMaskIsReadByItsZeros) {
  onnx::GraphProto graph;
  *graph.add_input() = MaskInput("attention_mask");
  *graph.add_initializer() = MakeInt64Tensor("axes", {1, 2});
  *graph.add_initializer() = testing::FloatTensor("one_f", {}, {1.0f});
  *graph.add_initializer() = testing::FloatTensor("lowest", {}, {-3.4028234663852886e38f});
  *graph.add_initializer() = testing::FloatTensor("half", {}, {0.5f});
  *graph.add_node() = testing::WithIntAttribute(MakeNode("Cast", {"attention_mask"}, {"float_mask"}), "to",
                                                onnx::TensorProto::FLOAT);
  *graph.add_node() = MakeNode("Unsqueeze", {"float_mask", "axes"}, {"mask4d"});
  *graph.add_node() = MakeNode("Sub", {"one_f", "mask4d"}, {"inverted"});
  *graph.add_node() = MakeNode("Mul", {"inverted", "lowest"}, {"additive"});
  *graph.add_node() = MakeNode("Mul", {"mask4d", "half"}, {"not_a_mask"});
  MaskMeaning meaning = Probe(graph, "additive", /*additive=*/true);
  EXPECT_EQ(meaning.kind, MaskMeaning::Kind::kKeyPadding) << meaning.why;
  EXPECT_EQ(meaning.padding_input, "attention_mask");
  MaskMeaning other = Probe(graph, "not_a_mask", /*additive=*/true);
  EXPECT_EQ(other.kind, MaskMeaning::Kind::kUnknown);
  EXPECT_FALSE(other.within_causal) << "no mask says nothing of what it lets a query see";
}

}  // namespace
}  // namespace onnxopt
