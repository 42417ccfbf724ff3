// Output parity between the original and a candidate model in ONNX Runtime. The original runs once
// per input set (supplied with the job, or generated per shape set and sample) and its outputs are
// kept as the reference, so many candidates (bisection probes) can be judged against the same run.
// Each output is compared by the allclose rule with a tolerance chosen per output: the config's
// per-output tolerance, else its global atol/rtol, else the default for the candidate's precision.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_PARITY_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_PARITY_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/input_generator.h"

namespace onnxopt {

inline constexpr double kDefaultAtol = 1e-4;
inline constexpr double kDefaultRtol = 1e-3;

// The element-wise allclose rule, |actual - expected| <= atol + rtol * |expected|, with NaN equal to
// NaN and infinities equal when their signs are.
bool AllClose(double actual, double expected, double atol, double rtol);

// Compares one output; fills everything in `result` but name, sample and tolerance source. With
// min_cosine > 0, an output outside atol/rtol passes by agreement (see Tolerance::min_cosine).
void CompareOutput(const Ort::Value& expected, const Ort::Value& actual, double atol, double rtol,
                   v1::OutputParity* result, double min_cosine = 0);

// "fp32", "fp16", "bf16" or "int8": the lowest precision the model computes in (quantization
// operators, then half-precision tensors or casts).
std::string ModelPrecision(const onnx::ModelProto& model);

struct Tolerance {
  double atol = kDefaultAtol;
  double rtol = kDefaultRtol;
  std::string source;  // "output", "config" or the precision whose default it is
  // > 0: an output outside atol/rtol still passes with this cosine similarity and, if it is
  // classifier-shaped, 99% top-1 agreement (quantized models).
  double min_cosine = 0;
};

inline constexpr double kMinTop1Agreement = 0.99;

// The tolerance for output `name` of a candidate of `precision`.
Tolerance ToleranceFor(const v1::ValidationConfig& config, const std::string& name, const std::string& precision);

// Checks that a config's validation settings make sense (INVALID_ARGUMENT otherwise).
absl::Status CheckValidationSettings(const v1::ValidationConfig& config);

// The original's outputs on every input set.
struct ParityReference {
  struct InputSet {
    int shape_set = 0;
    int sample = 0;
    GeneratedInputs inputs;
    std::vector<Ort::Value> expected;
  };
  std::vector<std::string> output_names;
  std::vector<InputSet> sets;
  // A mask input: outputs whose first two dims are its [batch, sequence] are compared where it is
  // non-zero only (remove_padding leaves 0 at padded positions).
  std::string valid_positions_of;
};

// Runs the original on every input set (the first one twice: a model that disagrees with itself
// cannot be judged, FAILED_PRECONDITION NONDETERMINISTIC_MODEL). Fills the report's input
// description. INVALID_ARGUMENT when ONNX Runtime cannot run the original; CANCELLED on cancel.
absl::StatusOr<ParityReference> BuildParityReference(Ort::Session& original, const onnx::ModelProto& original_model,
                                                     const v1::ValidationConfig& config,
                                                     const std::vector<SuppliedSample>& supplied,
                                                     const std::atomic<bool>* cancelled, v1::ParityReport* report);

// Runs `candidate` on the reference's inputs and compares every output (report.outputs and
// report.passed are replaced). INTERNAL when ONNX Runtime cannot run the candidate.
absl::Status CompareWithReference(Ort::Session& candidate, const std::string& candidate_precision,
                                  const ParityReference& reference, const v1::ValidationConfig& config,
                                  const std::atomic<bool>* cancelled, v1::ParityReport* report);

// Both steps for two sessions: what `onnxopt compare` and the tests use.
absl::Status CheckParity(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& original_model,
                         const v1::ValidationConfig& config, const std::atomic<bool>* cancelled,
                         v1::ParityReport* report, const std::string& candidate_precision = "fp32",
                         const std::vector<SuppliedSample>& supplied = {});

// ONNX Runtime's level for `level`, `fallback` when unspecified; and its name for reports.
GraphOptimizationLevel OrtLevel(v1::OrtOptimizationLevel level, GraphOptimizationLevel fallback);
std::string OrtLevelName(GraphOptimizationLevel level);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_PARITY_H_
