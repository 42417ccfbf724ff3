// The original and the optimized model side by side in ONNX Runtime: parity on the same generated
// inputs (allclose per output), then a latency benchmark with both models timed interleaved.
#ifndef ONNXOPT_OPTIMIZER_VALIDATOR_H_
#define ONNXOPT_OPTIMIZER_VALIDATOR_H_

#include <atomic>
#include <vector>

#include "absl/status/status.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/ort_runtime.h"

namespace onnxopt {

inline constexpr double kDefaultAtol = 1e-4;
inline constexpr double kDefaultRtol = 1e-3;
inline constexpr int kDefaultWarmupRuns = 5;
inline constexpr int kDefaultIterations = 30;
inline constexpr double kDefaultTimeBudgetSeconds = 30;

// The element-wise allclose rule, |actual - expected| <= atol + rtol * |expected|, with NaN equal to
// NaN and infinities equal when their signs are.
bool AllClose(double actual, double expected, double atol, double rtol);

// Compares one output; fills everything in `result` but name and sample.
void CompareOutput(const Ort::Value& expected, const Ort::Value& actual, double atol, double rtol,
                   v1::OutputParity* result);

// Checks that a config's validation and benchmark settings make sense (INVALID_ARGUMENT otherwise).
absl::Status CheckValidationConfig(const v1::OptimizationConfig& config);

// Runs both models on the same inputs and compares every output. INVALID_ARGUMENT if ONNX Runtime
// cannot run the original, INTERNAL if it cannot run the optimized one, CANCELLED on cancel.
absl::Status CheckParity(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& original_model,
                         const v1::ValidationConfig& config, const std::atomic<bool>* cancelled,
                         v1::ParityReport* report);

// Times both sessions interleaved (alternating which goes first) after warm-up.
absl::Status Benchmark(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& original_model,
                       const v1::OptimizationConfig& config, const std::atomic<bool>* cancelled,
                       v1::BenchmarkReport* report);

// Order statistics of latencies in milliseconds.
v1::LatencyStats Summarize(std::vector<double> latencies_ms);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATOR_H_
