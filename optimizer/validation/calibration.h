// Calibration: the range each chosen float value of a model takes on a set of inputs, for static
// quantization (an int8 scale and zero point fixed ahead of time instead of measured on every run).
//
// Methods, as ONNX Runtime's and TensorRT's calibrators name them:
//   minmax      the smallest and largest value seen;
//   percentile  the same with the outermost 0.001% of values cut off (half from each tail, as ONNX
//               Runtime's calibrator does), so that a rare outlier does not widen the step for
//               everything else;
//   entropy     the clipping threshold |x| <= t whose 128-level quantization loses the least
//               information, in Kullback-Leibler divergence, of the histogram of |x| (TensorRT's
//               algorithm), intersected with the seen range.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_CALIBRATION_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_CALIBRATION_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass.h"
#include "optimizer/run_context.h"
#include "optimizer/validation/input_generator.h"

namespace onnxopt {

// A histogram of values over [low, high] in equal bins.
struct Histogram {
  double low = 0;
  double high = 0;
  std::vector<double> counts;
  void Add(const float* values, size_t n);  // values outside [low, high] go to the end bins
};

inline constexpr int kCalibrationBins = 2048;
inline constexpr double kCalibrationPercentile = 99.999;

// The range that keeps `percentile`% of the histogram's mass, cutting the rest equally from both tails.
ValueRange PercentileRange(const Histogram& histogram, double percentile);
// The threshold t (histogram of |x| over [0, max|x|]) that minimizes the divergence of its 128-level
// quantization from the clipped distribution.
float EntropyThreshold(const Histogram& magnitudes);

// Every value `values` names (each must be float32: it is fetched as a float32 graph output), on
// every input set: its range by `method` (minmax, percentile or entropy; INVALID_ARGUMENT otherwise).
// The model runs without ONNX Runtime's rewrites, each value fetched through an Identity; values that
// never hold a finite element are left out of the result.
// INTERNAL when ONNX Runtime cannot run it; CANCELLED on cancel.
absl::StatusOr<std::map<std::string, ValueRange>> CalibrateRanges(const onnx::ModelProto& model,
                                                                   const std::vector<std::string>& values,
                                                                   const std::vector<const GeneratedInputs*>& samples,
                                                                   const std::string& method,
                                                                   const SessionSettings& device,
                                                                   const RunContext& run = RunContext());

// The same with input sets made by `make_samples` from the session calibration runs in (whose inputs
// are the model's), so that the model is loaded once for both.
using CalibrationSamples = std::function<absl::StatusOr<std::vector<GeneratedInputs>>(Ort::Session& session)>;
absl::StatusOr<std::map<std::string, ValueRange>> CalibrateRanges(const onnx::ModelProto& model,
                                                                   const std::vector<std::string>& values,
                                                                   const CalibrationSamples& make_samples,
                                                                   const std::string& method,
                                                                   const SessionSettings& device,
                                                                   const RunContext& run = RunContext());

// The float32 values `values` names, as `model` computes them (no ONNX Runtime rewrites) on the one
// input set `make_sample` makes from the session: each handed to `visit(name, shape, data)` while the
// run's outputs are alive. INTERNAL when ONNX Runtime cannot run it; CANCELLED on cancel.
using CaptureSample = std::function<absl::StatusOr<GeneratedInputs>(Ort::Session& session)>;
using CapturedValue =
    std::function<void(const std::string& name, const std::vector<int64_t>& shape, const float* data)>;
absl::Status CaptureValues(const onnx::ModelProto& model, const std::vector<std::string>& values,
                           const CaptureSample& make_sample, const SessionSettings& device,
                           const RunContext& run, const CapturedValue& visit);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_CALIBRATION_H_
