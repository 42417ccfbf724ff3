// canonicalize_packed_head_split: a packed projection split into heads before it is split into parts
// (ModernBERT's Wqkv; Split as TorchScript writes unbind, Slices as dynamo does) becomes a Split of the
// last axis and a head Reshape per part, with the same outputs; other shapes stay.
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
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
using testing::WithIntAttribute;

enum class Cut { kSplit, kSlices };

// x [2, 5, 3*N*D] -> Reshape [0, 0, 3, n, d] -> three parts [2, 5, N, D], each transposed to heads.
onnx::ModelProto PackedHeadSplit(Cut cut, int64_t heads, int64_t head_size, std::vector<int64_t> target) {
  const int64_t width = 3 * heads * head_size;
  onnx::GraphProto graph;
  *graph.add_input() = FloatValue("x", {2, 5, width});
  *graph.add_initializer() = MakeInt64Tensor("target", target);
  *graph.add_initializer() = MakeInt64Tensor("axis", {2});
  *graph.add_node() = MakeNode("Reshape", {"x", "target"}, {"packed"});
  std::vector<std::string> parts = {"p0", "p1", "p2"};
  if (cut == Cut::kSplit) {
    *graph.add_initializer() = MakeInt64Tensor("ones", {1, 1, 1});
    *graph.add_node() = WithIntAttribute(MakeNode("Split", {"packed", "ones"}, parts), "axis", -3);
  } else {
    for (int i = 0; i < 3; ++i) {
      *graph.add_initializer() = MakeInt64Tensor(absl::StrCat("start", i), {i});
      *graph.add_initializer() = MakeInt64Tensor(absl::StrCat("end", i), {i + 1});
      *graph.add_node() = MakeNode("Slice", {"packed", absl::StrCat("start", i), absl::StrCat("end", i), "axis"},
                                   {parts[static_cast<size_t>(i)]});
    }
  }
  for (int i = 0; i < 3; ++i) {
    const std::string part = parts[static_cast<size_t>(i)];
    *graph.add_node() = MakeNode("Squeeze", {part, "axis"}, {part + "_heads"});
    *graph.add_output() = FloatValue(part + "_heads", {2, 5, heads, head_size});
  }
  return MakeModel(graph, 17);
}

TEST(CanonicalizePackedHeadSplitTest, PartsOfTheLastAxisBecomeHeads) {
  for (Cut cut : {Cut::kSplit, Cut::kSlices}) {
    for (const auto& target : std::vector<std::vector<int64_t>>{{0, 0, 3, 2, 4}, {2, 5, 3, -1, 4}, {0, 0, 3, 2, -1}}) {
      const onnx::ModelProto original = PackedHeadSplit(cut, 2, 4, target);
      PassRun run = testing::RunPass("canonicalize_packed_head_split", original);
      ASSERT_TRUE(run.status.ok()) << run.status;
      EXPECT_EQ(run.report.rewrites(), 1) << target[3] << " " << target[4];
      std::map<std::string, int> ops = OpCounts(run.model);
      EXPECT_EQ(ops["Split"], 1);
      EXPECT_EQ(ops["Reshape"], 3) << "one head split per part";
      EXPECT_EQ(ops.count("Squeeze"), 0u);
      EXPECT_EQ(ops.count("Slice"), 0u);
      ExpectSameOutputs(original, run.model, 0, 0);
    }
  }
}

TEST(CanonicalizePackedHeadSplitTest, OtherSplitsStay) {
  // The parts are not the third axis' three ones (a target [B, S, n, 3, d] splits another way).
  PassRun other_axis = testing::RunPass("canonicalize_packed_head_split", PackedHeadSplit(Cut::kSplit, 2, 4, {0, 0, 2, 3, 4}));
  EXPECT_EQ(other_axis.report.rewrites(), 0);
  // The first two elements are not x's B and S.
  PassRun other_rows = testing::RunPass("canonicalize_packed_head_split", PackedHeadSplit(Cut::kSlices, 2, 4, {5, 2, 3, 2, 4}));
  EXPECT_EQ(other_rows.report.rewrites(), 0);
}

}  // namespace
}  // namespace onnxopt
