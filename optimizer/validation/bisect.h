// When the pipeline's output fails parity: find the pass run that breaks it and fall back to the
// best model that passes. Passes are deterministic, so replaying the pipeline from the original and
// stopping after k graph-changing pass runs reproduces the k-th intermediate model; a binary search
// over k (the original passes, the full output fails) finds a run whose input passes and whose
// output fails. The pipeline then runs again without that pass; up to three culprits are taken out
// before the original itself is returned.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_BISECT_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_BISECT_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/pass_manager.h"
#include "optimizer/run_context.h"

namespace onnxopt {

inline constexpr int kMaxCulprits = 3;

// Judges a candidate model against the original; fills `parity` and says whether it passed.
using ParityProbe = std::function<absl::StatusOr<bool>(const onnx::ModelProto& candidate, v1::ParityReport* parity)>;

struct BisectionResult {
  onnx::ModelProto model;               // the best model that passes (the original if nothing else did)
  std::vector<v1::PassReport> passes;   // of the run that made `model` (empty for the original)
  v1::ParityReport parity;              // of `model`
  v1::Bisection bisection;
};

// `failed` is the model the full pipeline produced and `failed_run` its pass reports.
absl::StatusOr<BisectionResult> BisectAndRecover(const onnx::ModelProto& original, const Pipeline& pipeline,
                                                 const onnx::ModelProto& failed,
                                                 const std::vector<v1::PassReport>& failed_run,
                                                 const ParityProbe& probe, const RunContext& run);

// The nodes `before` has and `after` lacks, as "OpType name" (at most `limit`).
std::vector<std::string> RemovedNodes(const onnx::GraphProto& before, const onnx::GraphProto& after, size_t limit = 50);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_BISECT_H_
