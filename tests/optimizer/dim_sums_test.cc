// Sums of named dims (dim_sums.h) and the shapes they give a decoder with a cache.
#include "optimizer/dim_sums.h"

#include <cctype>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optimizer/passes/constants.h"
#include "optimizer/shape_info.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

using testing::FloatValue;
using testing::MakeModel;
using testing::MakeNode;
using testing::WithIntAttribute;
using testing::WithIntsAttribute;

TEST(DimSumTest, OneSpellingForEverySum) {
  const DimSum key_length = DimSum::Parse("sequence").Plus(DimSum::Parse("past_sequence"));
  EXPECT_EQ(key_length.Spell(), "past_sequence + sequence");
  EXPECT_EQ(DimSum::Parse("sequence + past_sequence").Spell(), "past_sequence + sequence");
  EXPECT_EQ(DimSum::Parse("past_sequence_length + 1").Spell(), "past_sequence_length + 1");
  EXPECT_EQ(key_length.Plus(DimSum::Parse("sequence"), -1).Spell(), "past_sequence");
  EXPECT_TRUE(key_length.Plus(key_length, -1).IsNumber());
  EXPECT_EQ(DimSum::Parse("a").Plus(DimSum::Parse("a")).Plus(DimSum::Number(-3)).Spell(), "2*a - 3");
  EXPECT_EQ(DimSum::Parse("2*a - 3").Spell(), "2*a - 3");
  EXPECT_EQ(DimSum::Number(0).Plus(DimSum::Parse("b"), -1).Spell(), "-b");
  EXPECT_EQ(DimSum::Parse("-b + a").Spell(), "a - b");
}

TEST(DimSumTest, WhatIsNotASumIsOneSymbol) {
  for (const char* name : {"batch*sequence", "seq len", "a +", "+ a", "a + + b", "x:2"}) {
    const DimSum sum = DimSum::Parse(name);
    ASSERT_EQ(sum.terms.size(), 1u) << name;
    EXPECT_EQ(sum.terms.begin()->first, name);
    EXPECT_EQ(sum.Spell(), name);
  }
}

// A decoder's key length, once as the Concat of the past and the new keys (the scores' K) and once as
// Shape(past)[2] + Shape(ids)[1] (the mask's expand, made once for every layer): one dim.
TEST(DimSumTest, TheCachesConcatAndTheMasksCountAreOneKeyLength) {
  onnx::GraphProto graph;
  onnx::ValueInfoProto past = FloatValue("past", {1, 4, 1, 16});
  onnx::ValueInfoProto k = FloatValue("k", {1, 4, 1, 16});
  onnx::ValueInfoProto ids = FloatValue("ids", {1, 1});
  auto name = [](onnx::ValueInfoProto* value, int i, const char* param) {
    value->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(i)->set_dim_param(param);
  };
  name(&past, 0, "batch");
  name(&past, 2, "past_sequence");
  name(&k, 0, "batch");
  name(&k, 2, "sequence");
  name(&ids, 0, "batch");
  name(&ids, 1, "sequence");
  *graph.add_input() = past;
  *graph.add_input() = k;
  *graph.add_input() = ids;
  *graph.add_initializer() = MakeInt64Tensor("two", {2});
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"past", "k"}, {"keys"}), "axis", 2);
  *graph.add_node() = MakeNode("Shape", {"past"}, {"past_shape"});
  *graph.add_node() = MakeNode("Gather", {"past_shape", "two"}, {"p"});
  *graph.add_node() = MakeNode("Shape", {"ids"}, {"ids_shape"});
  *graph.add_node() = MakeNode("Gather", {"ids_shape", "one"}, {"s"});
  *graph.add_node() = MakeNode("Add", {"p", "s"}, {"t"});
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"s", "t"}, {"bias_shape"}), "axis", 0);
  *graph.add_node() = MakeNode("ConstantOfShape", {"bias_shape"}, {"bias"});
  // masking_utils' cache positions: arange(P, P + S) has S elements.
  *graph.add_node() = MakeNode("Squeeze", {"p"}, {"p0"});
  *graph.add_node() = MakeNode("Squeeze", {"t"}, {"t0"});
  *graph.add_node() = MakeNode("Squeeze", {"one"}, {"step"});
  *graph.add_node() = MakeNode("Range", {"p0", "t0", "step"}, {"positions"});
  // Sub(T, S): the past's length again.
  *graph.add_node() = MakeNode("Sub", {"t", "s"}, {"offset"});
  for (const char* output : {"keys", "bias", "positions", "offset"}) {
    onnx::ValueInfoProto value = FloatValue(output, {});
    value.mutable_type()->mutable_tensor_type()->clear_shape();
    *graph.add_output() = value;
  }
  const ShapeInfo shapes = ShapeInfo::Infer(MakeModel(graph, 17));
  const auto* key_length = shapes.Dim("keys", 2);
  ASSERT_NE(key_length, nullptr);
  EXPECT_EQ(key_length->dim_param(), "past_sequence + sequence");
  EXPECT_TRUE(shapes.SameDim("bias", 1, "keys", 2));
  EXPECT_TRUE(shapes.SameDim("bias", 0, "ids", 1));
  EXPECT_TRUE(shapes.SameDim("positions", 0, "ids", 1));
  const auto* offset = shapes.SymbolicValue("offset");
  ASSERT_NE(offset, nullptr);
  ASSERT_EQ(offset->size(), 1u);
  EXPECT_EQ((*offset)[0].dim_param(), "past_sequence");
}

// The value as a tensor of that name with dims (a number, a name, or "" for unknown).
onnx::ValueInfoProto Declared(const std::string& name, const std::vector<std::string>& dims) {
  onnx::ValueInfoProto value = FloatValue(name, {});
  auto* shape = value.mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->clear_dim();
  for (const std::string& d : dims) {
    auto* dim = shape->add_dim();
    if (d.empty()) continue;
    if (std::isdigit(static_cast<unsigned char>(d[0]))) {
      dim->set_dim_value(std::stoll(d));
    } else {
      dim->set_dim_param(d);
    }
  }
  return value;
}

// A decoder exported with a cache names its key length total_sequence twice: on attention_mask
// [batch, total_sequence] and on the present [batch, 4, total_sequence, 16], which is the Concat of the
// past and the new keys. The sweep reads total_sequence as past_sequence + sequence, so the mask
// expanded to a computed [.., sequence, past_sequence + sequence] (made before the first layer's Concat,
// as exports make it once for every layer) and the keys have one length.
TEST(DimSumTest, APresentDeclaredWithTheMasksNameSaysWhatThatNameIs) {
  onnx::GraphProto graph;
  *graph.add_input() = Declared("attention_mask", {"batch", "total_sequence"});
  *graph.add_input() = Declared("ids", {"batch", "sequence"});
  *graph.add_input() = Declared("past", {"batch", "4", "past_sequence", "16"});
  *graph.add_input() = Declared("k", {"batch", "4", "sequence", "16"});
  *graph.add_initializer() = MakeInt64Tensor("two", {2});
  *graph.add_initializer() = MakeInt64Tensor("one", {1});
  *graph.add_initializer() = MakeInt64Tensor("zero", {0});
  *graph.add_initializer() = MakeInt64Tensor("unit", {1});
  // The mask's [B, 1, S, P + S], before the keys are concatenated.
  *graph.add_node() = MakeNode("Shape", {"past"}, {"past_shape"});
  *graph.add_node() = MakeNode("Gather", {"past_shape", "two"}, {"p"});
  *graph.add_node() = MakeNode("Shape", {"ids"}, {"ids_shape"});
  *graph.add_node() = MakeNode("Gather", {"ids_shape", "one"}, {"s"});
  *graph.add_node() = MakeNode("Gather", {"ids_shape", "zero"}, {"b"});
  *graph.add_node() = MakeNode("Add", {"p", "s"}, {"t"});
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"b", "unit", "s", "t"}, {"mask_shape"}), "axis", 0);
  *graph.add_node() = MakeNode("Unsqueeze", {"attention_mask", "one"}, {"mask_3d"});
  *graph.add_node() = MakeNode("Unsqueeze", {"mask_3d", "one"}, {"mask_4d"});
  *graph.add_node() = MakeNode("Expand", {"mask_4d", "mask_shape"}, {"mask"});
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"past", "k"}, {"present"}), "axis", 2);
  *graph.add_node() = MakeNode("Identity", {"mask"}, {"mask_out"});
  *graph.add_output() = Declared("present", {"batch", "4", "total_sequence", "16"});
  *graph.add_output() = Declared("mask_out", {"", "", "", ""});
  const ShapeInfo shapes = ShapeInfo::Infer(MakeModel(graph, 17));
  EXPECT_EQ(shapes.dim_aliases().at("total_sequence"), "past_sequence + sequence");
  EXPECT_TRUE(shapes.SameDim("mask", 3, "present", 2));
  EXPECT_TRUE(shapes.SameDim("attention_mask", 1, "present", 2));
  EXPECT_EQ(shapes.Dim("present", 2)->dim_param(), "past_sequence + sequence");
  // A sweep given the aliases (as the pipeline hands them on) finds the same in one run.
  const ShapeInfo again = ShapeInfo::Infer(MakeModel(graph, 17), shapes.dim_aliases());
  EXPECT_TRUE(again.SameDim("mask", 3, "present", 2));
}

// A merged decoder's branch without a past: its present is the new keys [.., sequence, ..], which the
// If declares [.., total_sequence, ..] as attention_mask is. There total_sequence is sequence.
TEST(DimSumTest, AnOutputDeclaredUnderAnotherNameOfWhatItComputesIsThatName) {
  onnx::GraphProto graph;
  *graph.add_input() = Declared("attention_mask", {"batch", "total_sequence"});
  *graph.add_input() = Declared("k", {"batch", "sequence", "4", "16"});
  *graph.add_node() = WithIntsAttribute(MakeNode("Transpose", {"k"}, {"present"}), "perm", {0, 2, 1, 3});
  *graph.add_output() = Declared("present", {"batch", "4", "total_sequence", "16"});
  const ShapeInfo shapes = ShapeInfo::Infer(MakeModel(graph, 17));
  EXPECT_EQ(shapes.dim_aliases().at("total_sequence"), "sequence");
  EXPECT_TRUE(shapes.SameDim("attention_mask", 1, "k", 1));
}

// A name is never read as a sum that holds it (past + total_sequence declared total_sequence), and a
// number says nothing.
TEST(DimSumTest, NoAliasOfANameToItselfOrToANumber) {
  onnx::GraphProto graph;
  *graph.add_input() = Declared("past", {"batch", "total_sequence"});
  *graph.add_input() = Declared("k", {"batch", "sequence"});
  *graph.add_input() = Declared("x", {"batch", "8"});
  *graph.add_node() = WithIntAttribute(MakeNode("Concat", {"past", "k"}, {"grown"}), "axis", 1);
  *graph.add_node() = MakeNode("Identity", {"x"}, {"y"});
  *graph.add_output() = Declared("grown", {"batch", "total_sequence"});
  *graph.add_output() = Declared("y", {"batch", "width"});
  const ShapeInfo shapes = ShapeInfo::Infer(MakeModel(graph, 17));
  EXPECT_TRUE(shapes.dim_aliases().empty());
}

}  // namespace
}  // namespace onnxopt
