// fold_relative_position_buckets: T5's relative position buckets become a table lookup, and the
// outputs stay the same at lengths inside and past the bucket function's max_distance; functions that
// never settle, or that are not element-wise in one integer, are left alone.
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt::testing {
namespace {

TEST(FoldRelativePositionBucketsTest, T5BucketsBecomeATableWithTheSameOutputs) {
  auto original = LoadModel(FixturePath("hf/t5_encoder_torchscript.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  PassRun run = RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto ops = OpCounts(run.model);
  for (const char* gone : {"Log", "Abs", "Min", "Less"}) EXPECT_EQ(ops.count(gone), 0u) << gone;
  EXPECT_EQ(ops["Clip"], 1);
  // 300 tokens: relative distances past T5's max_distance (128) read the table's clipped ends.
  v1::ParityReport parity;
  ExpectParityOnPaddedBatches(*original, run.model, 2, {16, 128, 300}, &parity);
}

// d = k[None, :] - q[:, None] over two position inputs of `length`; y = Gather(W, f(d)).
onnx::ModelProto BucketModel(const std::string& function, int64_t table_rows, int64_t length = 64) {
  onnx::GraphProto graph;
  *graph.add_input() = MakeValue("query_positions", onnx::TensorProto::INT64, {length});
  *graph.add_input() = MakeValue("key_positions", onnx::TensorProto::INT64, {length});
  *graph.add_initializer() = MakeInt64Tensor("axis0", {0});
  *graph.add_initializer() = MakeInt64Tensor("axis1", {1});
  *graph.add_node() = MakeNode("Unsqueeze", {"key_positions", "axis0"}, {"k"});
  *graph.add_node() = MakeNode("Unsqueeze", {"query_positions", "axis1"}, {"q"});
  *graph.add_node() = MakeNode("Sub", {"k", "q"}, {"d"});
  *graph.add_initializer() = MakeInt64Tensor("two", {2});
  *graph.add_initializer() = MakeInt64Tensor("cap", {40});
  *graph.add_initializer() = MakeInt64Tensor("offset", {100});
  *graph.add_initializer() = MakeInt64Tensor("row_offsets", std::vector<int64_t>(length, 1));
  if (function == "capped") {  // min(|2d|, 40): settles at |d| = 20
    *graph.add_node() = MakeNode("Mul", {"d", "two"}, {"doubled"});
    *graph.add_node() = MakeNode("Abs", {"doubled"}, {"distance"});
    *graph.add_node() = MakeNode("Min", {"distance", "cap"}, {"idx"});
  } else if (function == "growing") {  // |d| + 100: never settles
    *graph.add_node() = MakeNode("Abs", {"d"}, {"distance"});
    *graph.add_node() = MakeNode("Mul", {"distance", "two"}, {"doubled"});
    *graph.add_node() = MakeNode("Add", {"doubled", "offset"}, {"idx"});
  } else {  // per column: a constant of `length` elements, so not a function of each d alone
    *graph.add_node() = MakeNode("Abs", {"d"}, {"distance"});
    *graph.add_node() = MakeNode("Add", {"distance", "row_offsets"}, {"shifted"});
    *graph.add_node() = MakeNode("Min", {"shifted", "cap"}, {"idx"});
  }
  *graph.add_initializer() = FloatTensor("W", {table_rows, 3}, RandomFloats(table_rows * 3, 7));
  *graph.add_node() = MakeNode("Gather", {"W", "idx"}, {"y"});
  *graph.add_output() = FloatValue("y", {length, length, 3});
  return MakeModel(graph, 14);
}

TEST(FoldRelativePositionBucketsTest, FoldsASettlingFunctionExactly) {
  const onnx::ModelProto original = BucketModel("capped", 41);
  PassRun run = RunPass("fold_relative_position_buckets", original);
  EXPECT_EQ(run.report.rewrites(), 1);
  auto ops = OpCounts(run.model);
  EXPECT_EQ(ops.count("Abs") + ops.count("Min") + ops.count("Mul"), 0u);
  for (const auto& tensor : run.model.graph().initializer()) {
    if (absl::StrContains(tensor.name(), "by_position")) {
      ASSERT_EQ(tensor.dims_size(), 2);
      EXPECT_EQ(tensor.dims(0), 41) << "d in [-20, 20]";
    }
  }
  ExpectSameOutputs(original, run.model, 0, 0);
}

TEST(FoldRelativePositionBucketsTest, LeavesFunctionsThatNeverSettleOrReadMoreThanD) {
  for (const char* function : {"growing", "per_column"}) {
    const onnx::ModelProto original = BucketModel(function, 200000);
    PassRun run = RunPass("fold_relative_position_buckets", original);
    EXPECT_EQ(run.report.rewrites(), 0) << function;
    EXPECT_EQ(OpCounts(run.model).count("Clip"), 0u) << function;
  }
}

}  // namespace
}  // namespace onnxopt::testing
