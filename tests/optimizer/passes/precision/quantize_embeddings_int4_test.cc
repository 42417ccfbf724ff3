// quantize_embeddings_int4: a token table becomes 4-bit blocks that ONNX Runtime's GatherBlockQuantized
// dequantizes per looked-up row exactly as the blocks say (rows with outliers included); a table read
// by more than row lookups stays in float; and a decoder's int4 job with `embeddings: int4` keeps its
// verdict.
#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/passes/precision/weight_blocks.h"
#include "optimizer/validation/input_generator.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

constexpr int64_t kRows = 1024, kWidth = 96;

// ids [2, 5] -> Gather(table [kRows, kWidth]) -> rows [2, 5, kWidth], and `tied`: the table read by a
// MatMul too (an output projection sharing it).
onnx::ModelProto TableModel(const std::vector<float>& table, bool tied) {
  onnx::GraphProto graph;
  *graph.add_input() = testing::MakeValue("ids", onnx::TensorProto::INT64, {2, 5});
  *graph.add_initializer() = testing::FloatTensor("table", {kRows, kWidth}, table);
  *graph.add_node() = testing::MakeNode("Gather", {"table", "ids"}, {"rows"});
  *graph.add_output() = testing::FloatValue("rows", {2, 5, kWidth});
  if (tied) {
    *graph.add_node() = testing::MakeNode("MatMul", {"rows", "table_t"}, {"logits"});
    *graph.add_node() = testing::WithIntsAttribute(testing::MakeNode("Transpose", {"table"}, {"table_t"}), "perm", {1, 0});
    *graph.add_output() = testing::FloatValue("logits", {2, 5, kRows});
  }
  return testing::MakeModel(std::move(graph));
}

std::vector<float> Table() {
  std::vector<float> table = testing::RandomFloats(kRows * kWidth, 7);
  for (int64_t row : {3, 500, 1023}) {  // outlier rows, as trained tables have
    for (int64_t j = 0; j < kWidth; ++j) table[row * kWidth + j] *= 20.0f;
  }
  table[17 * kWidth + 40] = 50.0f;  // one outlier value inside a block
  return table;
}

TEST(QuantizeEmbeddingsInt4Test, LookedUpRowsAreTheBlocksDequantized) {
  const std::vector<float> table = Table();
  testing::PassRun run = testing::RunPass("quantize_embeddings_int4", TableModel(table, false));
  EXPECT_EQ(run.report.rewrites(), 1);
  EXPECT_EQ(testing::OpCounts(run.model)["GatherBlockQuantized"], 1);
  EXPECT_EQ(testing::OpCounts(run.model)["Gather"], 0);
  int64_t before = 0, after = 0;
  for (const auto& count : run.report.counters()) {
    if (count.first == "weight_bytes_before") before = count.second;
    if (count.first == "weight_bytes_after") after = count.second;
  }
  EXPECT_EQ(before, kRows * kWidth * 4);
  EXPECT_EQ(after, kRows * kWidth / 2 + kRows * (kWidth / 32) * 4);  // nibbles and one scale per 32

  // What the blocks stand for, computed here the way MatMulNBits' weights are.
  FloatWeight weight{{}, kWidth, kRows};
  weight.values.resize(table.size());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kWidth; ++j) weight.values[j * kRows + r] = table[r * kWidth + j];
  }
  BlockQuantization how;
  std::optional<BlockQuantized> blocks = QuantizeBlocks(weight, how);
  ASSERT_TRUE(blocks.has_value());
  const std::vector<float> expected = DequantizeBlocks(*blocks, kWidth, kRows, how);  // [k, n]

  auto session = CreateSession({run.model.SerializeAsString(), {}}, SessionSettings());
  ASSERT_TRUE(session.ok()) << session.status();
  const std::vector<int64_t> ids = {0, 3, 17, 500, 1023, 1, 2, 999, 17, 512};
  GeneratedInputs feed;
  Ort::AllocatorWithDefaultOptions allocator;
  const int64_t shape[2] = {2, 5};
  Ort::Value value = Ort::Value::CreateTensor<int64_t>(allocator, shape, 2);
  std::copy(ids.begin(), ids.end(), value.GetTensorMutableData<int64_t>());
  feed.names.push_back("ids");
  feed.values.push_back(std::move(value));
  auto ran = RunOnInputs(**session, feed, {"rows"});
  ASSERT_TRUE(ran.ok()) << ran.status();
  const float* rows = (*ran)[0].GetTensorData<float>();
  double worst_exact = 0, worst_relative = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    float row_max = 0;
    for (int64_t j = 0; j < kWidth; ++j) row_max = std::max(row_max, std::abs(table[ids[i] * kWidth + j]));
    for (int64_t j = 0; j < kWidth; ++j) {
      const float got = rows[i * kWidth + j];
      worst_exact = std::max<double>(worst_exact, std::abs(got - expected[j * kRows + ids[i]]));
      worst_relative = std::max<double>(worst_relative, std::abs(got - table[ids[i] * kWidth + j]) / row_max);
    }
  }
  EXPECT_LE(worst_exact, 1e-6) << "ONNX Runtime reads the blocks as MatMulNBits' layout says";
  // Levels -8..7 with the block's largest magnitude at -8: a level (1/8 of it) at most, where the
  // opposite extreme clips to 7; half a level elsewhere.
  EXPECT_LE(worst_relative, 1.0 / 8 + 1e-6);
}

TEST(QuantizeEmbeddingsInt4Test, ATableReadByMoreThanRowLookupsStaysInFloat) {
  testing::PassRun run = testing::RunPass("quantize_embeddings_int4", TableModel(Table(), true));
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::SkipCount(run.report, "read by more than row lookups"), 1);
}

TEST(QuantizeEmbeddingsInt4Test, RowsThatAreNoMultipleOfTheBlockStayInFloat) {
  testing::PassRun run = testing::RunConfig(
      R"({"passes": [{"name": "quantize_embeddings_int4", "params": {"block_size": 64}}]})", TableModel(Table(), false));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 0);
  EXPECT_EQ(testing::SkipCount(run.report, "not a multiple of the block"), 1);
}

}  // namespace
}  // namespace onnxopt
