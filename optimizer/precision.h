// The precision section of a job's config: which passes a mode runs, what the report says about
// them, int8_static's calibration, and automatic mixed precision, the search for the few nodes that
// must stay in float32 when a lower-precision model fails parity (for int8, typically a projection
// whose error the output is most sensitive to).
//
// The search, after a failed check: (0) the conversion again with every operator type ONNX Runtime
// has no kernel for on this device kept in float32; (1) nodes whose outputs leave the target's range in a float32
// run on the parity inputs (|x| > 65504 for float16) are kept; (2) if that is not enough, a binary
// search along the graph's order for the shortest prefix of nodes whose keeping passes, then for the
// latest start of that window that still passes. Every candidate is converted from the float32
// model afresh and judged by the same parity probe; a candidate ONNX Runtime cannot load for want of
// a kernel (bfloat16 on the CPU) gets that operator type kept, up to a bound.
#ifndef ONNXOPT_OPTIMIZER_PRECISION_H_
#define ONNXOPT_OPTIMIZER_PRECISION_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/pass_manager.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/run_context.h"
#include "optimizer/validation/bisect.h"
#include "optimizer/validation/calibration.h"
#include "optimizer/validation/input_generator.h"

namespace onnxopt {

using PrecisionMode = v1::PrecisionConfig::Mode;

// Whether `mode` under `precision` makes the model's float inputs and outputs float16/bfloat16
// (keep_io_types off, mode fp16 or bf16).
bool ChangesFloatInterface(const v1::PrecisionConfig& precision, PrecisionMode mode);

// Whether the config asks for anything but float32.
bool PrecisionRequested(const v1::PrecisionConfig& precision);

// How int4 stores the output projection (unset: int4) and the token embedding tables (unset: float).
v1::Int4Config::Storage LmHeadStorage(const v1::Int4Config& int4);
v1::Int4Config::Storage EmbeddingStorage(const v1::Int4Config& int4);

// INVALID_ARGUMENT (with the known names) for a value none of its enum's (a binary request's number) or
// settings out of range.
absl::Status CheckPrecisionConfig(const v1::PrecisionConfig& precision);

// What to keep in higher precision beyond the config's own lists.
// int8_static also needs the calibrated ranges of the activations it quantizes.
struct PrecisionExtras {
  std::set<std::string> keep_nodes;
  std::set<std::string> keep_ops;
  std::map<std::string, ValueRange> activation_ranges;
};

// int8_static's calibration: the range of every activation a quantized product reads, by the
// config's method (minmax by default) over `calibration.samples` input sets (default 16): the
// supplied inputs when the job has them, else generated ones (different samples from parity's),
// in which case `warning` says that generated data is a poor calibration set.
absl::StatusOr<std::map<std::string, ValueRange>> CalibrateActivations(
    const onnx::ModelProto& fp32_model, const onnx::ModelProto& original, const v1::PrecisionConfig& precision,
    const v1::ValidationConfig& validation, const std::vector<SuppliedSample>& supplied,
    const SessionSettings& device, const RunContext& run, std::string* warning);

// int4: report->projections and the means (projection_error.h) for `converted` against `fp32_model`,
// the activations captured by running the float32 model on the job's first supplied input set (else a
// generated one) when `activations_fit` says its session fits the job's memory; else output errors
// are left unmeasured with the reason.
void DescribeInt4Errors(const onnx::ModelProto& fp32_model, const onnx::ModelProto& converted,
                        const onnx::ModelProto& original, const v1::PrecisionConfig& precision,
                        const v1::ValidationConfig& validation, const std::vector<SuppliedSample>& supplied,
                        const SessionSettings& device, const RunContext& run,
                        const std::function<absl::Status()>& activations_fit, v1::PrecisionReport* report);

// The mode's passes then the cleanups they need; an empty pipeline for fp32.
absl::StatusOr<Pipeline> BuildPrecisionPipeline(const v1::PrecisionConfig& precision, const PassRegistry& registry,
                                                const PrecisionExtras& extras = {});

// Runs the mode's pipeline on `model` in place, appending its pass reports to `runs`.
absl::Status ApplyPrecision(const v1::PrecisionConfig& precision, const PrecisionExtras& extras,
                            const PassManagerOptions& options, onnx::ModelProto* model,
                            std::vector<v1::PassReport>* runs);

// Fills `report` from the precision passes' reports (counters, kept nodes) and the two models.
void DescribePrecision(const v1::PrecisionConfig& precision, const onnx::ModelProto& fp32_model,
                       const onnx::ModelProto& converted, const std::vector<v1::PassReport>& runs,
                       v1::PrecisionReport* report);

// The largest magnitude each float value of the model takes on the probe's inputs.
using ActivationMagnitudes =
    std::function<absl::StatusOr<std::map<std::string, double>>(const onnx::ModelProto& fp32_model)>;

struct MixedPrecisionResult {
  onnx::ModelProto model;
  std::vector<v1::PassReport> runs;
  v1::ParityReport parity;
  std::vector<v1::KeptNode> kept;
  int attempts = 0;
};

// A node the search may keep in float32, with what was measured of its error in the lower precision
// (int4's projections: report.proto's ProjectionError).
struct MeasuredError {
  std::string node;  // NodeKey
  std::string why;   // e.g. "output error 0.083"
};

// int4's projections from `measured` (report.proto's ProjectionError rows, worst first): the search's
// order to keep them in.
std::vector<MeasuredError> WorstProjections(const v1::PrecisionReport& measured);

// After a mixed search: `report` gets `measured`'s projection rows of the nodes still quantized (not
// in `kept`), their means, method and note.
void KeepProjectionsStillQuantized(const v1::PrecisionReport& measured, const std::vector<v1::KeptNode>& kept,
                                   v1::PrecisionReport* report);

// nullopt when no candidate that still converts something passes; `failure` then says why. Every
// candidate is converted with `base` (calibrated ranges) plus the nodes it keeps. `worst_first`: nodes
// by measured error, largest first; when given, the fewest of its leading nodes that pass are kept
// where they are fewer than the window the bisection along the graph finds.
absl::StatusOr<std::optional<MixedPrecisionResult>> SearchMixedPrecision(
    const onnx::ModelProto& fp32_model, const v1::PrecisionConfig& precision, const PrecisionExtras& base,
    const ParityProbe& probe, const ActivationMagnitudes& ranges, const PassManagerOptions& options,
    std::string* failure = nullptr, const std::vector<MeasuredError>& worst_first = {});

// `candidate` as the original's callers see it: inputs and outputs that became float16/bfloat16
// (keep_io_types off) are float32 again behind Casts, so that parity and the benchmark feed and read
// it like the original. A candidate with the original's interface comes back unchanged.
onnx::ModelProto WithOriginalInterface(const onnx::ModelProto& candidate, const onnx::ModelProto& original);

// "Could not find an implementation for Op(13) node ..." in a load failure -> "Op".
std::optional<std::string> MissingKernelOp(const std::string& message);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PRECISION_H_
