// How the benchmark holds the two models' sessions (BenchmarkConfig.sessions): side by side when both
// fit in the job's memory target, else alternating — one session open at a time, each model timing
// every shape set and generation phase in its window, the greedy check replaying the original's picks
// on the result. Either way the report has the same figures, and says which way they were taken.
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/optimize.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

v1::Report OptimizeCacheDecoder(v1::BenchmarkSessions sessions, const std::string& name) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("cache/cache_decoder_gqa3.onnx");
  request.output_dir = testing::TempDir(name);
  request.durable_output = false;
  request.config.set_preset(v1::Pipelines::transformer);
  v1::BenchmarkConfig& benchmark = *request.config.mutable_benchmark();
  benchmark.set_sessions(sessions);
  benchmark.set_time_budget_seconds(2);
  v1::GenerationConfig& generation = *benchmark.mutable_generation();
  generation.add_batch_sizes(1);
  generation.add_batch_sizes(2);
  generation.add_decode_past(16);
  generation.set_prefill_tokens(8);
  generation.set_greedy_tokens(8);
  generation.set_runs(6);
  auto result = Optimize(request);
  EXPECT_TRUE(result.ok()) << result.status();
  std::filesystem::remove_all(request.output_dir);
  return result.ok() ? result->report : v1::Report();
}

TEST(AlternatingSessionsTest, TheBenchmarkAndGenerationRunOneSessionAtATimeWithTheSameFigures) {
  const v1::Report report = OptimizeCacheDecoder(v1::BENCHMARK_SESSIONS_ALTERNATING, "alternating_sessions");
  EXPECT_TRUE(absl::StartsWith(report.memory().benchmark_sessions(), "alternating")) << report.memory().DebugString();
  const v1::BenchmarkReport& benchmark = report.benchmark();
  ASSERT_GT(benchmark.shapes_size(), 0);
  for (const auto& shape : benchmark.shapes()) {
    EXPECT_EQ(shape.windows(), 3) << "one window a round";
    EXPECT_GE(shape.original().runs(), 9) << "at least 3 runs a window";
    EXPECT_GE(shape.optimized().runs(), 9);
    EXPECT_GT(shape.speedup(), 0);
    EXPECT_GT(shape.speedup_p90(), 0) << "runs of one round paired";
  }
  EXPECT_GT(benchmark.speedup(), 0);
  const v1::GenerationReport& generation = report.generation();
  ASSERT_EQ(generation.phases_size(), 4) << "prefill and one decode, at two batch sizes";
  for (const auto& phase : generation.phases()) {
    EXPECT_TRUE(phase.error().empty()) << phase.error();
    EXPECT_GE(phase.original().runs(), 3) << phase.phase();
    EXPECT_GE(phase.optimized().runs(), 3) << phase.phase();
    EXPECT_GT(phase.speedup(), 0);
  }
  EXPECT_EQ(generation.steps_size(), 8);
  EXPECT_TRUE(generation.passed()) << generation.note();
  EXPECT_EQ(generation.identical_steps(), 8) << "float32 fusions pick every token the original picks";
}

TEST(AlternatingSessionsTest, TheGreedyCheckGivesTheSameTokensEitherWay) {
  const v1::Report alternating = OptimizeCacheDecoder(v1::BENCHMARK_SESSIONS_ALTERNATING, "greedy_alternating");
  const v1::Report side_by_side = OptimizeCacheDecoder(v1::BENCHMARK_SESSIONS_SIDE_BY_SIDE, "greedy_side_by_side");
  EXPECT_TRUE(absl::StartsWith(side_by_side.memory().benchmark_sessions(), "side by side"));
  ASSERT_EQ(alternating.generation().steps_size(), side_by_side.generation().steps_size());
  for (int step = 0; step < alternating.generation().steps_size(); ++step) {
    const v1::GenerationStep& a = alternating.generation().steps(step);
    const v1::GenerationStep& b = side_by_side.generation().steps(step);
    EXPECT_EQ(std::vector<int64_t>(a.original_tokens().begin(), a.original_tokens().end()),
              std::vector<int64_t>(b.original_tokens().begin(), b.original_tokens().end()))
        << step;
    EXPECT_EQ(std::vector<int64_t>(a.optimized_tokens().begin(), a.optimized_tokens().end()),
              std::vector<int64_t>(b.optimized_tokens().begin(), b.optimized_tokens().end()))
        << step;
    EXPECT_NEAR(a.logits_cosine(), b.logits_cosine(), 1e-9) << step;
  }
}

TEST(AlternatingSessionsTest, SmallModelsAreTimedSideBySideAndEveryStageIsMeasured) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("bert_tiny.onnx");
  request.output_dir = testing::TempDir("side_by_side_sessions");
  request.durable_output = false;
  request.config.mutable_benchmark()->set_time_budget_seconds(1);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::MemoryReport& memory = result->report.memory();
  EXPECT_TRUE(absl::StartsWith(memory.benchmark_sessions(), "side by side: both models")) << memory.benchmark_sessions();
  EXPECT_NE(memory.benchmark_sessions().find("fit in the job's memory target"), std::string::npos);
  const char* stages[] = {"load", "passes", "precision", "save", "validation", "benchmark", "delivery"};
  ASSERT_EQ(memory.stages_size(), 7);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(memory.stages(i).stage(), stages[i]);
    EXPECT_GT(memory.stages(i).peak_resident_bytes(), 0);
    EXPECT_GE(memory.stages(i).seconds(), 0);
  }
  EXPECT_EQ(memory.model_bytes(), result->report.original().model_bytes());
  EXPECT_GT(memory.peak_over_model(), 0);
  std::filesystem::remove_all(request.output_dir);
}

}  // namespace
}  // namespace onnxopt
