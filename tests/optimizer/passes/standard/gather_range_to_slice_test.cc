// gather_range_to_slice: it fires where it may, skips (with its reason) where it may not, and the
// rewritten model computes the same outputs in ONNX Runtime.
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
using testing::RunPass;
using testing::WithIntAttribute;

// data [4, 6, 5] -> Gather(axis 1, Range(start, limit, delta))
onnx::ModelProto RangeGatherModel(int64_t start, int64_t delta, std::optional<int64_t> limit) {
  onnx::GraphProto graph;
  *graph.add_initializer() = MakeInt64Tensor("start", {start});
  graph.mutable_initializer(0)->clear_dims();  // scalar
  *graph.add_initializer() = MakeInt64Tensor("delta", {delta});
  graph.mutable_initializer(1)->clear_dims();
  if (limit) {
    *graph.add_initializer() = MakeInt64Tensor("limit", {*limit});
    graph.mutable_initializer(2)->clear_dims();
  } else {  // the size of dim 2 of x, a value only known at run time
    *graph.add_node() = MakeNode("Shape", {"x"}, {"shape"});
    *graph.add_initializer() = MakeInt64Tensor("two", {2});
    graph.mutable_initializer(2)->clear_dims();
    *graph.add_node() = MakeNode("Gather", {"shape", "two"}, {"limit"});
  }
  *graph.add_node() = MakeNode("Range", {"start", "limit", "delta"}, {"indices"});
  *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"x", "indices"}, {"y"}), "axis", 1);
  *graph.add_input() = FloatValue("x", {4, 6, 5});
  onnx::ValueInfoProto output = FloatValue("y", {});
  output.mutable_type()->mutable_tensor_type()->clear_shape();
  *graph.add_output() = output;
  return MakeModel(graph, 13);
}

TEST(GatherRangeToSliceTest, RewritesExactlyWhenBothAgree) {
  struct Case {
    int64_t start, delta;
    std::optional<int64_t> limit;
    bool fires;
  };
  for (const Case& c : std::vector<Case>{{0, 1, 6, true},
                                         {1, 2, 6, true},
                                         {3, 1, 2, true},          // empty range, empty slice
                                         {0, 1, std::nullopt, true},  // limit = a size
                                         {5, -1, -1, true},        // down to index 0
                                         {4, -2, 0, true},
                                         {-2, 1, 2, false},        // negative indices wrap in Gather
                                         {0, 1, -1, false}}) {     // Slice would read -1 as "dim - 1"
    const onnx::ModelProto original = RangeGatherModel(c.start, c.delta, c.limit);
    PassRun run = RunPass("gather_range_to_slice", original);
    const std::string where = ::testing::PrintToString(std::make_tuple(c.start, c.delta, c.limit.value_or(-99)));
    EXPECT_EQ(run.report.rewrites(), c.fires ? 1 : 0) << where;
    if (!c.fires) continue;
    EXPECT_EQ(OpCounts(run.model).count("Range"), 0u) << where;
    EXPECT_EQ(OpCounts(run.model)["Slice"], 1) << where;
    ExpectSameOutputs(original, run.model, 0, 0);
  }
}

// Constant indices that count in steps (what fold_constants makes of a static Range) slice too.
TEST(GatherRangeToSliceTest, ConstantProgressionsSliceToo) {
  struct Case {
    std::vector<int64_t> indices;
    bool fires;
  };
  for (const Case& c : std::vector<Case>{{{0, 1, 2, 3}, true},
                                         {{1, 3, 5}, true},
                                         {{4}, true},              // one index: a slice of one
                                         {{5, 4, 3, 2, 1, 0}, true},  // down to index 0
                                         {{4, 2}, true},
                                         {{0, 2, 3}, false},       // not one step
                                         {{1, 1}, false},          // step 0 repeats a row
                                         {{-1, 0}, false}}) {      // negative indices wrap in Gather
    onnx::GraphProto graph;
    *graph.add_initializer() = MakeInt64Tensor("indices", c.indices);
    *graph.add_node() = WithIntAttribute(MakeNode("Gather", {"x", "indices"}, {"y"}), "axis", 1);
    *graph.add_input() = FloatValue("x", {4, 6, 5});
    onnx::ValueInfoProto output = FloatValue("y", {});
    output.mutable_type()->mutable_tensor_type()->clear_shape();
    *graph.add_output() = output;
    const onnx::ModelProto original = MakeModel(graph, 13);
    PassRun run = RunPass("gather_range_to_slice", original);
    const std::string where = ::testing::PrintToString(c.indices);
    EXPECT_EQ(run.report.rewrites(), c.fires ? 1 : 0) << where;
    if (!c.fires) continue;
    EXPECT_EQ(OpCounts(run.model).count("Gather"), 0u) << where;
    ExpectSameOutputs(original, run.model, 0, 0);
  }
  // The seed fix: the transformer preset folds a static Range before gather_range_to_slice runs; the
  // Gather still becomes a Slice.
  const onnx::ModelProto original = RangeGatherModel(1, 2, 6);
  PassRun preset = testing::RunConfig(R"({"preset": "transformer"})", original);
  ASSERT_TRUE(preset.status.ok()) << preset.status;
  EXPECT_EQ(OpCounts(preset.model).count("Gather"), 0u);
  EXPECT_EQ(OpCounts(preset.model)["Slice"], 1);
  ExpectSameOutputs(original, preset.model, 0, 0);
}

}  // namespace
}  // namespace onnxopt
