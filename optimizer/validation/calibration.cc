#include "optimizer/validation/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/rewrite.h"
#include "optimizer/runtime_source.h"

namespace onnxopt {
namespace {

constexpr int kQuantizedLevels = 128;  // |x| on the int8 grid

// `model` with each of `values` fetched through an Identity whose output is a graph output; the
// names to fetch, in the order of `values`.
std::vector<std::string> ExposeValues(const std::vector<std::string>& values, onnx::ModelProto* model) {
  std::vector<std::string> fetched;
  onnx::GraphProto* graph = model->mutable_graph();
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string name = absl::StrCat("onnxopt_calibration_", i);
    *graph->add_node() = MakeNode("Identity", name, {values[i]}, {name});
    onnx::ValueInfoProto* output = graph->add_output();
    output->set_name(name);
    output->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    fetched.push_back(name);
  }
  return fetched;
}

bool IsFloatTensor(const Ort::Value& value) {
  return value.IsTensor() &&
         value.GetTensorTypeAndShapeInfo().GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

// Runs `session` on every sample and hands each fetched float tensor to `visit(index, data, n)`.
template <typename Visit>
absl::Status ForEachFetched(Ort::Session& session, const std::vector<const GeneratedInputs*>& samples,
                            const std::vector<std::string>& fetched, const RunContext& run,
                            Visit&& visit) {
  for (const GeneratedInputs* sample : samples) {
    if (absl::Status stop = run.CheckNotCancelled("during calibration"); !stop.ok()) return stop;
    absl::StatusOr<std::vector<Ort::Value>> outputs = RunOnInputs(session, *sample, fetched);
    if (!outputs.ok()) return outputs.status();
    for (size_t i = 0; i < outputs->size(); ++i) {
      const Ort::Value& value = (*outputs)[i];
      if (!IsFloatTensor(value)) continue;
      const size_t n = value.GetTensorTypeAndShapeInfo().GetElementCount();
      if (n > 0) visit(i, value.GetTensorData<float>(), n);
    }
  }
  return absl::OkStatus();
}

}  // namespace

void Histogram::Add(const float* values, size_t n) {
  const double width = (high - low) / static_cast<double>(counts.size());
  const int last = static_cast<int>(counts.size()) - 1;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) continue;
    // Clamped as a double: a value far outside [low, high] must not overflow the int conversion.
    const double position = width > 0 ? (values[i] - low) / width : 0.0;
    counts[static_cast<size_t>(std::clamp(position, 0.0, static_cast<double>(last)))] += 1;
  }
}

ValueRange PercentileRange(const Histogram& histogram, double percentile) {
  double total = 0;
  for (double count : histogram.counts) total += count;
  const double cut = total * (100.0 - percentile) / 200.0;  // per tail
  const double width = (histogram.high - histogram.low) / static_cast<double>(histogram.counts.size());
  size_t first = 0, last = histogram.counts.size() - 1;
  for (double seen = 0; first < last && seen + histogram.counts[first] <= cut; ++first) seen += histogram.counts[first];
  for (double seen = 0; last > first && seen + histogram.counts[last] <= cut; --last) seen += histogram.counts[last];
  return {static_cast<float>(histogram.low + width * static_cast<double>(first)),
          static_cast<float>(histogram.low + width * static_cast<double>(last + 1))};
}

float EntropyThreshold(const Histogram& magnitudes) {
  const std::vector<double>& hist = magnitudes.counts;
  const int bins = static_cast<int>(hist.size());
  const double width = (magnitudes.high - magnitudes.low) / bins;
  if (bins <= kQuantizedLevels) return static_cast<float>(magnitudes.high);
  std::vector<double> suffix(static_cast<size_t>(bins) + 1, 0.0);  // mass at and beyond each bin
  for (int i = bins - 1; i >= 0; --i) suffix[i] = suffix[i + 1] + hist[i];
  double best_divergence = std::numeric_limits<double>::infinity();
  int best = bins;
  std::vector<double> reference, expanded;
  for (int i = kQuantizedLevels; i <= bins; ++i) {
    // The clipped distribution: everything beyond the threshold lands in its last bin.
    reference.assign(hist.begin(), hist.begin() + i);
    reference[i - 1] += suffix[i];
    // Its 128-level quantization, spread back evenly over the bins that held anything.
    expanded.assign(static_cast<size_t>(i), 0.0);
    const double merged = static_cast<double>(i) / kQuantizedLevels;
    for (int level = 0; level < kQuantizedLevels; ++level) {
      const int begin = static_cast<int>(level * merged);
      const int end = level == kQuantizedLevels - 1 ? i : static_cast<int>((level + 1) * merged);
      double mass = 0;
      int occupied = 0;
      for (int k = begin; k < end; ++k) {
        mass += hist[k];
        occupied += hist[k] != 0;
      }
      for (int k = begin; k < end && occupied > 0; ++k) {
        if (hist[k] != 0) expanded[k] = mass / occupied;
      }
    }
    double reference_total = 0, expanded_total = 0;
    for (int k = 0; k < i; ++k) {
      reference_total += reference[k];
      expanded_total += expanded[k];
    }
    if (reference_total <= 0 || expanded_total <= 0) continue;
    double divergence = 0;
    for (int k = 0; k < i; ++k) {
      if (reference[k] <= 0) continue;
      const double p = reference[k] / reference_total;
      const double q = std::max(expanded[k] / expanded_total, 1e-12);
      divergence += p * std::log(p / q);
    }
    if (divergence < best_divergence) {
      best_divergence = divergence;
      best = i;
    }
  }
  return static_cast<float>(magnitudes.low + width * best);
}

namespace {

// `model` with `values` fetched (see ExposeValues), in a session without ONNX Runtime's rewrites.
absl::StatusOr<std::unique_ptr<Ort::Session>> ProbeSession(const onnx::ModelProto& model,
                                                           const std::vector<std::string>& values,
                                                           const SessionSettings& device,
                                                           std::vector<std::string>* fetched) {
  onnx::ModelProto probe = model;
  *fetched = ExposeValues(values, &probe);
  SessionSettings settings = device;
  settings.optimization_level = ORT_DISABLE_ALL;
  absl::StatusOr<ModelSource> source = RuntimeSource(probe);
  if (!source.ok()) return source.status();
  return CreateSession(*source, settings);
}

absl::Status CheckMethod(const std::string& method) {
  if (method == "minmax" || method == "percentile" || method == "entropy") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unknown calibration method '", method, "'"));
}

absl::StatusOr<std::map<std::string, ValueRange>> RangesOn(Ort::Session& session,
                                                           const std::vector<std::string>& values,
                                                           const std::vector<std::string>& fetched,
                                                           const std::vector<const GeneratedInputs*>& samples,
                                                           const std::string& method,
                                                           const RunContext& run) {
  std::map<std::string, ValueRange> ranges;
  if (samples.empty()) return ranges;

  // Pass 1: the range seen.
  std::vector<ValueRange> seen(values.size());
  std::vector<bool> any(values.size(), false);
  absl::Status status = ForEachFetched(session, samples, fetched, run, [&](size_t i, const float* data, size_t n) {
    for (size_t k = 0; k < n; ++k) {
      if (!std::isfinite(data[k])) continue;
      if (!any[i]) {
        seen[i] = {data[k], data[k]};
        any[i] = true;
      }
      seen[i].low = std::min(seen[i].low, data[k]);
      seen[i].high = std::max(seen[i].high, data[k]);
    }
  });
  if (!status.ok()) return status;

  // Pass 2 (percentile, entropy): a histogram over it, of x or of |x|.
  std::vector<Histogram> histograms(values.size());
  if (method != "minmax") {
    const bool magnitudes = method == "entropy";
    for (size_t i = 0; i < values.size(); ++i) {
      histograms[i].low = magnitudes ? 0.0 : seen[i].low;
      histograms[i].high = magnitudes ? std::max(std::fabs(seen[i].low), std::fabs(seen[i].high)) : seen[i].high;
      histograms[i].counts.assign(kCalibrationBins, 0.0);
    }
    std::vector<float> absolute;
    status = ForEachFetched(session, samples, fetched, run, [&](size_t i, const float* data, size_t n) {
      if (!magnitudes) return histograms[i].Add(data, n);
      absolute.resize(n);
      for (size_t k = 0; k < n; ++k) absolute[k] = std::fabs(data[k]);
      histograms[i].Add(absolute.data(), n);
    });
    if (!status.ok()) return status;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!any[i]) continue;
    ValueRange range = seen[i];
    if (method == "percentile") {
      range = PercentileRange(histograms[i], kCalibrationPercentile);
    } else if (method == "entropy") {
      const float threshold = EntropyThreshold(histograms[i]);
      range = {std::max(seen[i].low, -threshold), std::min(seen[i].high, threshold)};
    }
    ranges[values[i]] = range;
  }
  return ranges;
}

}  // namespace

absl::StatusOr<std::map<std::string, ValueRange>> CalibrateRanges(const onnx::ModelProto& model,
                                                                   const std::vector<std::string>& values,
                                                                   const std::vector<const GeneratedInputs*>& samples,
                                                                   const std::string& method,
                                                                   const SessionSettings& device,
                                                                   const RunContext& run) {
  if (absl::Status valid = CheckMethod(method); !valid.ok()) return valid;
  if (values.empty() || samples.empty()) return std::map<std::string, ValueRange>();
  std::vector<std::string> fetched;
  absl::StatusOr<std::unique_ptr<Ort::Session>> session = ProbeSession(model, values, device, &fetched);
  if (!session.ok()) return session.status();
  return RangesOn(**session, values, fetched, samples, method, run);
}

absl::StatusOr<std::map<std::string, ValueRange>> CalibrateRanges(const onnx::ModelProto& model,
                                                                   const std::vector<std::string>& values,
                                                                   const CalibrationSamples& make_samples,
                                                                   const std::string& method,
                                                                   const SessionSettings& device,
                                                                   const RunContext& run) {
  if (absl::Status valid = CheckMethod(method); !valid.ok()) return valid;
  if (values.empty()) return std::map<std::string, ValueRange>();
  std::vector<std::string> fetched;
  absl::StatusOr<std::unique_ptr<Ort::Session>> session = ProbeSession(model, values, device, &fetched);
  if (!session.ok()) return session.status();
  absl::StatusOr<std::vector<GeneratedInputs>> samples = make_samples(**session);
  if (!samples.ok()) return samples.status();
  std::vector<const GeneratedInputs*> pointers;
  for (const GeneratedInputs& sample : *samples) pointers.push_back(&sample);
  return RangesOn(**session, values, fetched, pointers, method, run);
}

absl::Status CaptureValues(const onnx::ModelProto& model, const std::vector<std::string>& values,
                           const CaptureSample& make_sample, const SessionSettings& device,
                           const RunContext& run, const CapturedValue& visit) {
  if (values.empty()) return absl::OkStatus();
  std::vector<std::string> fetched;
  absl::StatusOr<std::unique_ptr<Ort::Session>> session = ProbeSession(model, values, device, &fetched);
  if (!session.ok()) return session.status();
  absl::StatusOr<GeneratedInputs> sample = make_sample(**session);
  if (!sample.ok()) return sample.status();
  if (absl::Status stop = run.CheckNotCancelled("before capturing activations"); !stop.ok()) return stop;
  absl::StatusOr<std::vector<Ort::Value>> outputs = RunOnInputs(**session, *sample, fetched);
  if (!outputs.ok()) return outputs.status();
  for (size_t i = 0; i < outputs->size() && i < values.size(); ++i) {
    const Ort::Value& value = (*outputs)[i];
    if (!IsFloatTensor(value)) continue;
    visit(values[i], value.GetTensorTypeAndShapeInfo().GetShape(), value.GetTensorData<float>());
  }
  return absl::OkStatus();
}

}  // namespace onnxopt
