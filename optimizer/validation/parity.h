// Output parity between the original and a candidate model in ONNX Runtime. The original runs once
// per input set (supplied with the job, or generated per shape set and sample) and its outputs are
// kept as the reference, so many candidates (bisection probes) can be judged against the same run.
// Each output is compared by the allclose rule with a tolerance chosen per output: the config's
// per-output tolerance, else its global atol/rtol, else the default for the candidate's precision.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_PARITY_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_PARITY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/cache_interface.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/run_context.h"
#include "optimizer/validation/input_generator.h"

namespace onnxopt {

inline constexpr double kDefaultAtol = 1e-4;
inline constexpr double kDefaultRtol = 1e-3;
// The optimized model may deviate from the reference by this many times the original's own
// deviation on the job's device (ValidationConfig.noise_factor).
inline constexpr double kDefaultNoiseFactor = 2.0;

// The element-wise allclose rule, |actual - expected| <= atol + rtol * |expected|, with NaN equal to
// NaN and infinities equal when their signs are.
bool AllClose(double actual, double expected, double atol, double rtol);

// Compares one output; fills everything in `result` but name, sample and tolerance source. An element
// passes within atol + rtol * |expected|, or within `noise_bound` (the device's measured deviation,
// scaled), which then judged it. With min_cosine > 0, an output outside both passes by agreement (see
// Tolerance::min_cosine).
void CompareOutput(const Ort::Value& expected, const Ort::Value& actual, double atol, double rtol,
                   v1::OutputParity* result, double min_cosine = 0, double noise_bound = 0,
                   double max_kl = 0);

// "name: max abs error 0.3, 2% of elements outside tolerance" for the first failing output.
std::string WorstOutput(const v1::ParityReport& parity);

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
  // > 0: logits within min_cosine that miss the top-1 agreement still pass with a mean KL divergence
  // of at most this (quantized models).
  double max_kl = 0;
};

// KL(softmax(original) || softmax(optimized)) of one row of logits, in nats; -1 when the rows differ in
// size or hold a non-finite value.
double LogitsKlDivergence(const std::vector<float>& original, const std::vector<float>& optimized);

inline constexpr double kMinTop1Agreement = 0.99;
inline constexpr double kDefaultMaxKlDivergence = 0.01;

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
  // A decoder with a cache whose queries with no visible unmasked key are not compared (ParityReport's
  // rows_masked_entirely_skipped): their logits and the presents at their positions take the expected values.
  std::optional<CacheInterface> skip_rows_masked_entirely;
  // Per output: how far the original itself strays from `expected` on the job's device (max abs over
  // the input sets); empty where the device's sessions are the reference's.
  std::vector<double> device_deviation;
};

// Runs the original on every input set (the first one twice: a model that disagrees with itself
// cannot be judged, FAILED_PRECONDITION NONDETERMINISTIC_MODEL). Fills the report's input
// description. INVALID_ARGUMENT when ONNX Runtime cannot run the original; CANCELLED on cancel.
absl::StatusOr<ParityReference> BuildParityReference(Ort::Session& original, const onnx::ModelProto& original_model,
                                                     const v1::ValidationConfig& config,
                                                     const std::vector<SuppliedSample>& supplied,
                                                     const RunContext& run, v1::ParityReport* report);

// ValidationConfig.noise_factor, or its default.
double NoiseFactor(const v1::ValidationConfig& config);

// Runs the original on the job's device (`device_original`, where it is not the reference's session)
// on every input set and records its deviation from the reference per output; the report's outputs
// then show it and the bound it gives. INVALID_ARGUMENT when ONNX Runtime cannot run it there.
absl::Status MeasureDeviceDeviation(Ort::Session& device_original, const RunContext& run,
                                    ParityReference* reference);

// Runs `candidate` on the reference's inputs and compares every output (report.outputs and
// report.passed are replaced). INTERNAL when ONNX Runtime cannot run the candidate. `run_options`:
// the candidate's (an active LoRA adapter), default none.
absl::Status CompareWithReference(Ort::Session& candidate, const std::string& candidate_precision,
                                  const ParityReference& reference, const v1::ValidationConfig& config,
                                  const RunContext& run, v1::ParityReport* report,
                                  const Ort::RunOptions* run_options = nullptr);

// The two models CheckParity compares: the original, which makes the reference (and, without supplied
// inputs, the inputs), and the candidate.
struct ParityPair {
  Ort::Session& original;
  const onnx::ModelProto& original_model;
  Ort::Session& candidate;
  // The candidate's precision (ModelPrecision): it picks the default tolerances.
  std::string candidate_precision = "fp32";
  const Ort::RunOptions* candidate_run_options = nullptr;  // an active LoRA adapter's, else none
  // The candidate does not reproduce the rows of a decoder's queries that see no unmasked key
  // (ParityReference::skip_rows_masked_entirely); ignored for a model without a cache and a mask.
  bool skip_rows_masked_entirely = false;
};

// Both steps for two sessions: what `onnxopt compare` and the tests use. `supplied`: the job's input
// sets (none: generated ones).
absl::Status CheckParity(const ParityPair& pair, const v1::ValidationConfig& config,
                         const std::vector<SuppliedSample>& supplied, const RunContext& run, v1::ParityReport* report);


}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_PARITY_H_
