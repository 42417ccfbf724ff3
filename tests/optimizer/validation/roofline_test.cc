// Decode against the memory roofline: the bytes a step moves (weights, gathered embedding rows, the
// key/value cache read and written) and the share of the measured bandwidth a step's p50 reaches.
#include "optimizer/validation/roofline.h"

#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

class RooflineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 6 heads over 2 key/value heads of size 16, 2 layers: 4 cache entries [B, 2, P, 16] float.
    auto model = LoadModel(testing::FixturePath("cache/cache_decoder_gqa3.onnx"));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    auto cache = FindCacheInterface(model_.graph());
    ASSERT_TRUE(cache.has_value());
    cache_ = *cache;
  }
  onnx::ModelProto model_;
  CacheInterface cache_;
};

TEST_F(RooflineTest, AStepReadsTheWeightsTheGatheredRowsAndTheCache) {
  // Each past position is read once and written once per entry: 4 entries x 2 heads x 16 x 4 bytes x 2.
  const int64_t per_position = 4 * 2 * 16 * 4 * 2;
  EXPECT_EQ(StepBytes(model_, cache_, 1, 32, 1) - StepBytes(model_, cache_, 1, 16, 1), 16 * per_position);
  // Twice the rows: twice the cache, and one more embedding row.
  const int64_t one_row = StepBytes(model_, cache_, 1, 16, 1), two_rows = StepBytes(model_, cache_, 2, 16, 1);
  const int64_t cache_bytes = 17 * per_position / 2 + 16 * per_position / 2;  // presents of 17, pasts of 16
  int64_t all_weights = 0, table_row = 0;
  for (const auto& tensor : model_.graph().initializer()) {
    all_weights += TensorDataBytes(tensor);
    if (tensor.name().find("embed") != std::string::npos) table_row = TensorDataBytes(tensor) / tensor.dims(0);
  }
  ASSERT_GT(table_row, 0) << "the fixture's embedding table";
  EXPECT_EQ(two_rows - one_row, cache_bytes + table_row);
  EXPECT_LT(one_row - cache_bytes, all_weights) << "the embedding table is not read whole";
}

TEST_F(RooflineTest, APhasesFractionIsItsBytesAtTheBandwidthOverItsTime) {
  v1::GenerationReport report;
  v1::GenerationPhase* decode = report.add_phases();
  decode->set_phase("decode");
  decode->set_batch(1);
  decode->set_past(16);
  decode->set_new_tokens(1);
  decode->mutable_original()->set_p50_ms(2.0);
  decode->mutable_optimized()->set_p50_ms(1.0);
  v1::GenerationPhase* prefill = report.add_phases();
  prefill->set_phase("prefill");
  prefill->set_batch(1);
  prefill->set_new_tokens(8);
  prefill->mutable_optimized()->set_p50_ms(1.0);
  const double bandwidth = 1e9;
  DescribeRoofline(model_, model_, bandwidth, &report);
  const double bytes = static_cast<double>(StepBytes(model_, cache_, 1, 16, 1));
  EXPECT_EQ(decode->optimized_bytes_per_step(), static_cast<int64_t>(bytes));
  EXPECT_NEAR(decode->optimized_roofline_fraction(), bytes / bandwidth / 1e-3, 1e-12);
  EXPECT_NEAR(decode->original_roofline_fraction(), bytes / bandwidth / 2e-3, 1e-12);
  EXPECT_EQ(prefill->optimized_bytes_per_step(), 0) << "prefill is bound by arithmetic, not memory";
  EXPECT_DOUBLE_EQ(report.memory_bandwidth_bytes_per_second(), bandwidth);
}

// EmbedLayerNormalization looks its tables up as Gather does: GPT-2 fused (the word and position tables
// inside it) moves no more table bytes a step than the original's Gathers.
TEST(RooflineLookupTest, EmbedLayerNormalizationsTablesAreReadByTheRow) {
  auto original = LoadModel(testing::FixturePath("stacked_past/gpt2_plain_keys.onnx"));
  ASSERT_TRUE(original.ok()) << original.status();
  const std::optional<CacheInterface> cache = FindCacheInterface(original->graph());
  ASSERT_TRUE(cache.has_value());
  onnx::ModelProto fused = *original;
  onnx::GraphProto& graph = *fused.mutable_graph();
  // The two lookups become one EmbedLayerNormalization reading both tables (its other inputs as given).
  int gathers = 0;
  std::vector<std::string> tables;
  for (auto& node : *graph.mutable_node()) {
    if (node.op_type() != "Gather" || (node.input(0) != "wte.weight" && node.input(0) != "wpe.weight")) continue;
    tables.push_back(node.input(0));
    node.set_op_type("Identity");  // keeps the graph's shape; only the readers of the tables matter here
    node.mutable_input()->RemoveLast();
    node.set_input(0, node.input(0) + "_unread");
    ++gathers;
  }
  ASSERT_EQ(gathers, 2) << "the word and position lookups";
  onnx::NodeProto* embed = graph.add_node();
  embed->set_op_type("EmbedLayerNormalization");
  embed->set_domain("com.microsoft");
  for (const std::string& input : {std::string("input_ids"), std::string(""), tables[0], tables[1]}) embed->add_input(input);
  embed->add_output("embedded");
  EXPECT_EQ(StepBytes(fused, *cache, 1, 16, 1), StepBytes(*original, *cache, 1, 16, 1));
  embed->set_op_type("SkipLayerNormalization");  // a reader that is no lookup reads the tables whole
  EXPECT_GT(StepBytes(fused, *cache, 1, 16, 1), StepBytes(*original, *cache, 1, 16, 1));
}

TEST(MemoryBandwidthTest, IsMeasuredOncePerThreadCount) {
  const double first = MemoryReadBandwidth(1);
  EXPECT_GT(first, 1e9) << "any machine this runs on reads more than 1 GB/s";
  EXPECT_LT(first, 1e13);
  EXPECT_EQ(MemoryReadBandwidth(1), first);
}

}  // namespace
}  // namespace onnxopt
