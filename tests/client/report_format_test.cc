// The text report of a job whose original did not fit in memory: the result's figures alone, said so,
// never a speedup against figures that were not measured; and of a result fed logits_to_keep.
#include "client/report_format.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace onnxopt::client {
namespace {

v1::Report ResultTimedAlone() {
  v1::Report report;
  report.mutable_memory()->set_original_from_disk("the original (27.0 GiB) does not fit in the 21.9 GiB");
  v1::BenchmarkReport& benchmark = *report.mutable_benchmark();
  benchmark.set_original_not_timed("the original does not fit in memory");
  v1::ShapeBenchmark& shape = *benchmark.add_shapes();
  shape.mutable_optimized()->set_p50_ms(12.5);
  shape.mutable_optimized()->set_runs(5);
  *benchmark.mutable_optimized() = shape.optimized();
  v1::GenerationPhase& phase = *report.mutable_generation()->add_phases();
  phase.set_phase("decode");
  phase.set_batch(1);
  phase.set_new_tokens(1);
  phase.set_past(128);
  phase.mutable_optimized()->set_p50_ms(250);
  phase.mutable_optimized()->set_runs(3);
  phase.set_optimized_ms_per_token(250);
  phase.set_optimized_tokens_per_second(4);
  phase.set_optimized_bytes_per_step(int64_t{4} << 30);
  phase.set_optimized_roofline_fraction(0.8);
  return report;
}

TEST(ReportFormatTest, AResultTimedAloneShowsItsFiguresAndWhyTheOriginalsAreMissing) {
  const std::string text = FormatReport(ResultTimedAlone());
  EXPECT_TRUE(absl::StrContains(text, "original not timed: the original does not fit in memory")) << text;
  EXPECT_TRUE(absl::StrContains(text, "original from the disk: the original (27.0 GiB)")) << text;
  EXPECT_FALSE(absl::StrContains(text, "speedup    ")) << text;
  EXPECT_FALSE(absl::StrContains(text, "not run\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "12.500")) << "the result's p50\n" << text;
  EXPECT_TRUE(absl::StrContains(text, "roofline  80% (")) << text;
  EXPECT_FALSE(absl::StrContains(text, "0.000x")) << "no speedup over a missing figure\n" << text;
}

TEST(ReportFormatTest, ABenchmarkWithTheOriginalShowsTheSpeedup) {
  v1::Report report = ResultTimedAlone();
  report.mutable_benchmark()->clear_original_not_timed();
  v1::ShapeBenchmark& shape = *report.mutable_benchmark()->mutable_shapes(0);
  shape.mutable_original()->set_p50_ms(25);
  shape.mutable_original()->set_runs(5);
  shape.set_speedup(2);
  *report.mutable_benchmark()->mutable_original() = shape.original();
  const std::string text = FormatReport(report);
  EXPECT_TRUE(absl::StrContains(text, "speedup    2.000x")) << text;
  EXPECT_FALSE(absl::StrContains(text, "original not timed")) << text;
}

TEST(ReportFormatTest, AResultFedLogitsToKeepSaysSoBesideItsPhases) {
  v1::Report report = ResultTimedAlone();
  EXPECT_FALSE(absl::StrContains(FormatReport(report), "logits_to_keep")) << "only where it was fed";
  report.mutable_generation()->set_optimized_keeps_last_logits(true);
  const std::string text = FormatReport(report);
  EXPECT_TRUE(absl::StrContains(text, "logits_to_keep: the optimized model was fed 1")) << text;
}

}  // namespace
}  // namespace onnxopt::client
