#include "client/tracking_format.h"

#include <map>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace onnxopt::client {
namespace {

TEST(MlflowFormatTest, ParamsAreStringsMetricsNumbersTagsTheLineage) {
  v1::Report report;
  report.set_job("jobs/j1");
  report.set_pipeline("auto: transformer (bert)");
  report.set_optimizer_version("0.1.0");
  report.mutable_original()->set_nodes(261);
  report.mutable_optimized()->set_nodes(40);
  report.mutable_parity()->set_passed(true);
  auto* output = report.mutable_parity()->add_outputs();
  output->set_max_abs_error(2e-6);
  auto* other = report.mutable_parity()->add_outputs();
  other->set_max_abs_error(5e-6);
  auto* benchmark = report.mutable_benchmark();
  benchmark->set_speedup(1.8);
  benchmark->set_onnxruntime_version("1.29.0");
  benchmark->mutable_original()->set_runs(50);
  benchmark->mutable_original()->set_p50_ms(9.0);
  benchmark->mutable_optimized()->set_runs(50);
  benchmark->mutable_optimized()->set_p50_ms(5.0);
  v1::Job job;
  job.set_name("jobs/j1");
  job.set_state(v1::SUCCEEDED);
  job.mutable_model()->set_sha256("ab12");
  (*job.mutable_labels())["team"] = "search";
  (*job.mutable_labels())["mlflow_run_id"] = "r42";

  google::protobuf::Struct run;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(FormatMlflow(report, &job), &run).ok());
  const auto& params = run.fields().at("params").struct_value().fields();
  const auto& metrics = run.fields().at("metrics").struct_value().fields();
  const auto& tags = run.fields().at("tags").struct_value().fields();
  EXPECT_EQ(params.at("pipeline").string_value(), "auto: transformer (bert)");
  EXPECT_EQ(params.at("preset").string_value(), "auto");
  EXPECT_EQ(params.at("onnxruntime_version").string_value(), "1.29.0");
  EXPECT_DOUBLE_EQ(metrics.at("speedup").number_value(), 1.8);
  EXPECT_DOUBLE_EQ(metrics.at("optimized_p50_ms").number_value(), 5.0);
  EXPECT_DOUBLE_EQ(metrics.at("parity_max_abs_error").number_value(), 5e-6) << "the worst output";
  EXPECT_DOUBLE_EQ(metrics.at("nodes_after").number_value(), 40);
  EXPECT_EQ(tags.at("onnxopt.job").string_value(), "jobs/j1");
  EXPECT_EQ(tags.at("onnxopt.parity").string_value(), "passed");
  EXPECT_EQ(tags.at("onnxopt.source_sha256").string_value(), "ab12");
  EXPECT_EQ(tags.at("team").string_value(), "search");
  EXPECT_EQ(tags.at("mlflow_run_id").string_value(), "r42");
}

TEST(MlflowFormatTest, ASkippedBenchmarkLogsNoSpeedup) {
  v1::Report report;
  report.mutable_benchmark()->set_skipped(true);
  report.mutable_parity()->set_skipped(true);
  google::protobuf::Struct run;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(FormatMlflow(report, nullptr), &run).ok());
  EXPECT_EQ(run.fields().at("metrics").struct_value().fields().count("speedup"), 0u);
  EXPECT_EQ(run.fields().at("tags").struct_value().fields().at("onnxopt.parity").string_value(), "skipped");
}

TEST(KfpMetricsTest, SpeedupP50AndTheLargestParityErrorAsKubeflowNamesThem) {
  v1::Report report;
  report.mutable_benchmark()->set_speedup(2.0);
  report.mutable_benchmark()->mutable_optimized()->set_p50_ms(4.5);
  report.mutable_benchmark()->mutable_original()->set_p50_ms(9.0);
  report.mutable_parity()->add_outputs()->set_max_abs_error(3e-6);
  google::protobuf::Struct file;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(FormatKfpMetrics(report), &file).ok());
  std::map<std::string, double> metrics;
  for (const auto& metric : file.fields().at("metrics").list_value().values()) {
    const auto& fields = metric.struct_value().fields();
    EXPECT_EQ(fields.at("format").string_value(), "RAW");
    metrics[fields.at("name").string_value()] = fields.at("numberValue").number_value();
  }
  EXPECT_DOUBLE_EQ(metrics.at("speedup"), 2.0);
  EXPECT_DOUBLE_EQ(metrics.at("optimized-p50-ms"), 4.5);
  EXPECT_DOUBLE_EQ(metrics.at("parity-max-abs-error"), 3e-6);
}

}  // namespace
}  // namespace onnxopt::client
