#include "optimizer/validator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizer/input_generator.h"

namespace onnxopt {
namespace {

using Clock = std::chrono::steady_clock;

// Element values as doubles; false for element types that cannot be compared numerically.
bool ToDoubles(const Ort::Value& value, std::vector<double>* out) {
  auto info = value.GetTensorTypeAndShapeInfo();
  const size_t count = info.GetElementCount();
  out->resize(count);
  auto copy = [&](auto* data) {
    for (size_t i = 0; i < count; ++i) (*out)[i] = static_cast<double>(data[i]);
  };
  switch (info.GetElementType()) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: copy(value.GetTensorData<float>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: copy(value.GetTensorData<double>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: copy(value.GetTensorData<int64_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: copy(value.GetTensorData<int32_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: copy(value.GetTensorData<int16_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: copy(value.GetTensorData<int8_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: copy(value.GetTensorData<uint8_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: copy(value.GetTensorData<uint16_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: copy(value.GetTensorData<uint32_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: copy(value.GetTensorData<uint64_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: copy(value.GetTensorData<bool>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: {
      const auto* data = value.GetTensorData<Ort::Float16_t>();
      for (size_t i = 0; i < count; ++i) (*out)[i] = data[i].ToFloat();
      return true;
    }
    default:
      return false;
  }
}

absl::StatusOr<std::vector<Ort::Value>> RunSession(Ort::Session& session, GeneratedInputs& inputs,
                                                   std::vector<const char*>& output_names) {
  std::vector<const char*> input_names;
  for (const auto& name : inputs.names) input_names.push_back(name.c_str());
  try {
    return session.Run(Ort::RunOptions{nullptr}, input_names.data(), inputs.values.data(), inputs.values.size(),
                       output_names.data(), output_names.size());
  } catch (const Ort::Exception& e) {
    return absl::InternalError(e.what());
  }
}

std::vector<std::string> OutputNames(Ort::Session& session) {
  std::vector<std::string> names;
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session.GetOutputCount(); ++i) names.push_back(session.GetOutputNameAllocated(i, allocator).get());
  return names;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = p / 100.0 * (sorted.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(sorted.size() - 1, low + 1);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

}  // namespace

bool AllClose(double actual, double expected, double atol, double rtol) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) && std::isnan(actual);
  if (std::isinf(expected) || std::isinf(actual)) return actual == expected;
  return std::fabs(actual - expected) <= atol + rtol * std::fabs(expected);
}

void CompareOutput(const Ort::Value& expected, const Ort::Value& actual, double atol, double rtol,
                   v1::OutputParity* result) {
  result->set_atol(atol);
  result->set_rtol(rtol);
  if (!expected.IsTensor() || !actual.IsTensor()) {
    result->set_passed(expected.IsTensor() == actual.IsTensor());
    result->set_note("non-tensor output: not compared element-wise");
    return;
  }
  auto expected_info = expected.GetTensorTypeAndShapeInfo();
  auto actual_info = actual.GetTensorTypeAndShapeInfo();
  for (int64_t d : expected_info.GetShape()) result->add_shape(d);
  if (expected_info.GetShape() != actual_info.GetShape()) {
    result->set_passed(false);
    result->set_note(absl::StrCat("shape differs: original ", absl::StrJoin(expected_info.GetShape(), "x"),
                                  ", optimized ", absl::StrJoin(actual_info.GetShape(), "x")));
    return;
  }
  if (expected_info.GetElementType() != actual_info.GetElementType()) {
    result->set_passed(false);
    result->set_note("element type differs");
    return;
  }
  std::vector<double> want, got;
  if (!ToDoubles(expected, &want) || !ToDoubles(actual, &got)) {
    result->set_passed(false);
    result->set_note("element type cannot be compared");
    return;
  }
  double max_abs = 0, max_rel = 0;
  int64_t mismatches = 0;
  bool introduced = false;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool finite_expected = std::isfinite(want[i]);
    if (finite_expected && !std::isfinite(got[i])) introduced = true;
    if (!AllClose(got[i], want[i], atol, rtol)) ++mismatches;
    if (finite_expected && std::isfinite(got[i])) {
      const double abs_error = std::fabs(got[i] - want[i]);
      max_abs = std::max(max_abs, abs_error);
      max_rel = std::max(max_rel, abs_error / std::max(std::fabs(want[i]), 1e-12));
    }
  }
  result->set_max_abs_error(max_abs);
  result->set_max_rel_error(max_rel);
  result->set_mismatch_fraction(want.empty() ? 0.0 : static_cast<double>(mismatches) / want.size());
  result->set_nan_or_inf_introduced(introduced);
  result->set_passed(mismatches == 0 && !introduced);
}

absl::Status CheckValidationConfig(const v1::OptimizationConfig& config) {
  const auto& validation = config.validation();
  if (validation.atol() < 0 || validation.rtol() < 0 || !std::isfinite(validation.atol()) ||
      !std::isfinite(validation.rtol())) {
    return absl::InvalidArgumentError("validation.atol and validation.rtol must be finite and >= 0");
  }
  if (validation.samples() < 0 || validation.samples() > 100) {
    return absl::InvalidArgumentError("validation.samples must be between 1 and 100 (0 for the default)");
  }
  for (const auto& dim : validation.dim_values()) {
    if (dim.second < 1 || dim.second > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("validation.dim_values['", dim.first, "'] must be >= 1"));
    }
  }
  const auto& benchmark = config.benchmark();
  if (benchmark.warmup_runs() < 0 || benchmark.warmup_runs() > 10000 || benchmark.iterations() < 0 ||
      benchmark.iterations() > 100000) {
    return absl::InvalidArgumentError("benchmark.warmup_runs and benchmark.iterations must be >= 0 and reasonable");
  }
  if (benchmark.time_budget_seconds() < 0 || benchmark.time_budget_seconds() > 3600) {
    return absl::InvalidArgumentError("benchmark.time_budget_seconds must be between 0 and 3600");
  }
  if (benchmark.intra_op_threads() < 0 || benchmark.intra_op_threads() > 1024) {
    return absl::InvalidArgumentError("benchmark.intra_op_threads must be >= 0");
  }
  if (!v1::Device_IsValid(benchmark.device())) return absl::InvalidArgumentError("benchmark.device is unknown");
  return absl::OkStatus();
}

absl::Status CheckParity(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& original_model,
                         const v1::ValidationConfig& config, const std::atomic<bool>* cancelled,
                         v1::ParityReport* report) {
  const double atol = config.has_atol() ? config.atol() : kDefaultAtol;
  const double rtol = config.has_rtol() ? config.rtol() : kDefaultRtol;
  const int samples = config.samples() > 0 ? config.samples() : 1;
  report->set_seed(config.seed());
  const std::vector<std::string> names = OutputNames(original);
  if (OutputNames(optimized) != names) {
    return absl::InternalError("the optimized model's outputs differ from the original's");
  }
  std::vector<const char*> output_names;
  for (const auto& name : names) output_names.push_back(name.c_str());
  bool passed = true;
  for (int sample = 0; sample < samples; ++sample) {
    if (cancelled != nullptr && cancelled->load()) return absl::CancelledError("cancelled during validation");
    absl::StatusOr<GeneratedInputs> inputs = GenerateInputs(original, original_model, config, sample);
    if (!inputs.ok()) return inputs.status();
    if (sample == 0) report->mutable_input_shapes()->insert(inputs->shapes.begin(), inputs->shapes.end());
    auto expected = RunSession(original, *inputs, output_names);
    if (!expected.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("ORT_RUN_FAILED: ONNX Runtime cannot run the original model on "
                                                     "generated inputs: ", expected.status().message()));
    }
    if (sample == 0) {
      // A model that disagrees with itself (random ops, training-mode Dropout) cannot be judged.
      auto again = RunSession(original, *inputs, output_names);
      if (!again.ok()) return absl::InvalidArgumentError(absl::StrCat("ORT_RUN_FAILED: ", again.status().message()));
      for (size_t i = 0; i < names.size(); ++i) {
        v1::OutputParity self;
        CompareOutput((*expected)[i], (*again)[i], atol, rtol, &self);
        if (!self.passed()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "NONDETERMINISTIC_MODEL: the original model's output '", names[i],
              "' differs between two runs on the same inputs (random operators or training-mode Dropout?), so "
              "parity cannot be judged; set validation.skip to optimize it without a parity check"));
        }
      }
    }
    auto actual = RunSession(optimized, *inputs, output_names);
    if (!actual.ok()) {
      return absl::InternalError(absl::StrCat("ONNX Runtime cannot run the optimized model: ", actual.status().message()));
    }
    for (size_t i = 0; i < names.size(); ++i) {
      v1::OutputParity* output = report->add_outputs();
      output->set_name(names[i]);
      output->set_sample(sample);
      CompareOutput((*expected)[i], (*actual)[i], atol, rtol, output);
      passed &= output->passed();
    }
  }
  report->set_passed(passed);
  return absl::OkStatus();
}

v1::LatencyStats Summarize(std::vector<double> latencies_ms) {
  v1::LatencyStats stats;
  if (latencies_ms.empty()) return stats;
  std::sort(latencies_ms.begin(), latencies_ms.end());
  const double n = static_cast<double>(latencies_ms.size());
  const double mean = std::accumulate(latencies_ms.begin(), latencies_ms.end(), 0.0) / n;
  double variance = 0;
  for (double latency : latencies_ms) variance += (latency - mean) * (latency - mean);
  stats.set_runs(static_cast<int32_t>(latencies_ms.size()));
  stats.set_p50_ms(Percentile(latencies_ms, 50));
  stats.set_p90_ms(Percentile(latencies_ms, 90));
  stats.set_p99_ms(Percentile(latencies_ms, 99));
  stats.set_mean_ms(mean);
  stats.set_stddev_ms(n > 1 ? std::sqrt(variance / (n - 1)) : 0);
  stats.set_min_ms(latencies_ms.front());
  stats.set_max_ms(latencies_ms.back());
  stats.set_throughput_per_second(mean > 0 ? 1000.0 / mean : 0);
  return stats;
}

absl::Status Benchmark(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& original_model,
                       const v1::OptimizationConfig& config, const std::atomic<bool>* cancelled,
                       v1::BenchmarkReport* report) {
  const auto& settings = config.benchmark();
  const int warmup = settings.warmup_runs() > 0 ? settings.warmup_runs() : kDefaultWarmupRuns;
  const int iterations = settings.iterations() > 0 ? settings.iterations() : kDefaultIterations;
  const double budget = settings.time_budget_seconds() > 0 ? settings.time_budget_seconds() : kDefaultTimeBudgetSeconds;
  absl::StatusOr<GeneratedInputs> inputs = GenerateInputs(original, original_model, config.validation(), 0);
  if (!inputs.ok()) return inputs.status();
  const std::vector<std::string> names = OutputNames(original);
  std::vector<const char*> output_names;
  for (const auto& name : names) output_names.push_back(name.c_str());

  Ort::Session* sessions[2] = {&original, &optimized};
  std::vector<double> latencies[2];
  auto timed_run = [&](int which) -> absl::StatusOr<double> {
    const auto start = Clock::now();
    auto outputs = RunSession(*sessions[which], *inputs, output_names);
    if (!outputs.ok()) return outputs.status();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  for (int i = 0; i < warmup; ++i) {
    for (int which = 0; which < 2; ++which) {
      auto latency = timed_run(which);
      if (!latency.ok()) return latency.status();
    }
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget));
  constexpr int kMinimumRuns = 3;
  for (int i = 0; i < iterations; ++i) {
    if (cancelled != nullptr && cancelled->load()) return absl::CancelledError("cancelled during the benchmark");
    if (i >= kMinimumRuns && Clock::now() > deadline) break;
    for (int k = 0; k < 2; ++k) {
      const int which = (i % 2 == 0) ? k : 1 - k;  // alternate who goes first: neither gets a warmer cache
      auto latency = timed_run(which);
      if (!latency.ok()) return latency.status();
      latencies[which].push_back(*latency);
    }
  }
  *report->mutable_original() = Summarize(latencies[0]);
  *report->mutable_optimized() = Summarize(latencies[1]);
  report->set_warmup_runs(warmup);
  report->set_intra_op_threads(settings.intra_op_threads());
  report->set_onnxruntime_version(OrtVersion());
  if (report->optimized().p50_ms() > 0) report->set_speedup(report->original().p50_ms() / report->optimized().p50_ms());
  return absl::OkStatus();
}

}  // namespace onnxopt
