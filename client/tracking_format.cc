#include "client/tracking_format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/report_format.h"
#include "google/protobuf/struct.pb.h"

namespace onnxopt::client {
namespace {

void Put(google::protobuf::Struct* into, const std::string& key, const std::string& value) {
  if (!value.empty()) (*into->mutable_fields())[key].set_string_value(value);
}

// JSON has no NaN or infinity: a figure that is not finite is left out rather than written wrong.
void Put(google::protobuf::Struct* into, const std::string& key, double value) {
  if (std::isfinite(value)) (*into->mutable_fields())[key].set_number_value(value);
}

// The first shape set's latency figures of one model, as mlflow metric names.
void PutLatency(google::protobuf::Struct* metrics, const std::string& model, const v1::LatencyStats& stats) {
  if (stats.runs() == 0) return;
  Put(metrics, absl::StrCat(model, "_p50_ms"), stats.p50_ms());
  Put(metrics, absl::StrCat(model, "_p90_ms"), stats.p90_ms());
  Put(metrics, absl::StrCat(model, "_p99_ms"), stats.p99_ms());
  Put(metrics, absl::StrCat(model, "_throughput_per_second"), stats.throughput_per_second());
  if (stats.peak_memory_bytes() > 0) Put(metrics, absl::StrCat(model, "_peak_memory_bytes"), static_cast<double>(stats.peak_memory_bytes()));
}

double LargestParityError(const v1::ParityReport& parity) {
  double largest = 0;
  for (const auto& output : parity.outputs()) largest = std::max(largest, output.max_abs_error());
  return largest;
}

}  // namespace

std::string FormatMlflow(const v1::Report& report, const v1::Job* job) {
  google::protobuf::Struct run;
  google::protobuf::Struct* params = (*run.mutable_fields())["params"].mutable_struct_value();
  google::protobuf::Struct* metrics = (*run.mutable_fields())["metrics"].mutable_struct_value();
  google::protobuf::Struct* tags = (*run.mutable_fields())["tags"].mutable_struct_value();

  Put(params, "pipeline", report.pipeline());
  Put(params, "precision", report.precision().precision().empty() ? report.parity().precision()
                                                                  : report.precision().precision());
  Put(params, "benchmark_device", report.benchmark().device());
  Put(params, "execution_provider", report.benchmark().execution_provider());
  Put(params, "intra_op_threads", report.benchmark().skipped() ? "" : std::to_string(report.benchmark().intra_op_threads()));
  Put(params, "onnxopt_version", report.optimizer_version());
  Put(params, "onnxruntime_version", report.benchmark().onnxruntime_version());
  if (job != nullptr) {
    Put(params, "preset", v1::Pipelines::Preset_Name(job->config().preset()));
    Put(params, "config_cache_key", job->cache_key());
  }

  Put(metrics, "nodes_before", static_cast<double>(report.original().nodes()));
  Put(metrics, "nodes_after", static_cast<double>(report.optimized().nodes()));
  Put(metrics, "model_bytes_before", static_cast<double>(report.original().model_bytes()));
  Put(metrics, "model_bytes_after", static_cast<double>(report.optimized().model_bytes()));
  Put(metrics, "total_seconds", report.total_seconds());
  if (!report.parity().skipped() && report.parity().outputs_size() > 0) {
    double max_rel = 0;
    for (const auto& output : report.parity().outputs()) max_rel = std::max(max_rel, output.max_rel_error());
    Put(metrics, "parity_max_abs_error", LargestParityError(report.parity()));
    Put(metrics, "parity_max_rel_error", max_rel);
  }
  if (!report.benchmark().skipped() && report.benchmark().speedup() > 0) {
    Put(metrics, "speedup", report.benchmark().speedup());
    Put(metrics, "speedup_p10", report.benchmark().speedup_p10());
    Put(metrics, "speedup_p90", report.benchmark().speedup_p90());
    PutLatency(metrics, "original", report.benchmark().original());
    PutLatency(metrics, "optimized", report.benchmark().optimized());
  }

  Put(tags, "onnxopt.job", report.job());
  Put(tags, "onnxopt.parity", report.parity().skipped() ? "skipped" : report.parity().passed() ? "passed" : "failed");
  if (report.returned_original()) Put(tags, "onnxopt.returned_original", "true");
  if (!report.cached_from().empty()) Put(tags, "onnxopt.cached_from", report.cached_from());
  if (job != nullptr) {
    Put(tags, "onnxopt.source_sha256", job->model().sha256());
    Put(tags, "onnxopt.source_name", job->model().display_name());
    Put(tags, "onnxopt.state", v1::JobState_Name(job->state()));
    // The job's labels as they are (an "mlflow_run_id" label links the job back to its run); onnxopt's
    // own tags win over a label of the same name.
    for (const auto& [key, value] : job->labels()) {
      if (tags->fields().count(key) == 0) Put(tags, key, value);
    }
  }
  return ToJson(run);
}

std::string FormatKfpMetrics(const v1::Report& report) {
  google::protobuf::Struct file;
  google::protobuf::ListValue* metrics = (*file.mutable_fields())["metrics"].mutable_list_value();
  // KFP's names: lowercase, digits and dashes.
  auto add = [&](const std::string& name, double value) {
    if (!std::isfinite(value)) return;
    google::protobuf::Struct* metric = metrics->add_values()->mutable_struct_value();
    (*metric->mutable_fields())["name"].set_string_value(name);
    (*metric->mutable_fields())["numberValue"].set_number_value(value);
    (*metric->mutable_fields())["format"].set_string_value("RAW");
  };
  const v1::BenchmarkReport& benchmark = report.benchmark();
  if (!benchmark.skipped() && benchmark.speedup() > 0) {
    add("speedup", benchmark.speedup());
    add("optimized-p50-ms", benchmark.optimized().p50_ms());
    add("original-p50-ms", benchmark.original().p50_ms());
  }
  if (!report.parity().skipped() && report.parity().outputs_size() > 0) {
    add("parity-max-abs-error", LargestParityError(report.parity()));
  }
  return ToJson(file);
}

}  // namespace onnxopt::client
