// One optimization, start to end, with no server in sight: load the model (external data confined to
// its folder), check it, run the configured pipeline, save the result, then validate and benchmark the
// result against the original in ONNX Runtime. The server runs this on a worker thread; the CLI's
// `optimize` command runs it in-process.
#ifndef ONNXOPT_OPTIMIZER_OPTIMIZE_H_
#define ONNXOPT_OPTIMIZER_OPTIMIZE_H_

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/run_context.h"

namespace onnxopt {

inline constexpr char kOptimizerVersion[] = "0.1.0";
// The newest default-domain opset onnx 1.12's checker and shape inference know.
inline constexpr int kMaxCheckedOpset = 17;

enum class Phase { kLoading, kOptimizing, kSaving, kValidating, kBenchmarking };

struct OptimizeRequest {
  std::filesystem::path model_path;   // external data files sit next to it
  // Receives model.onnx (and model.onnx.data for big models), and ort_session.json after tuning.
  std::filesystem::path output_dir;
  v1::OptimizationConfig config;
  // Inputs supplied with the job: per input set, model input name -> TensorProto file.
  std::vector<std::map<std::string, std::filesystem::path>> input_files;
  RunContext run;  // stops the run when the job is cancelled
  std::function<void(Phase phase, const std::string& pass, int done, int total)> on_progress;
  // The saved model is on the disk when Optimize returns (SaveOptions::durable). The server's jobs
  // need it; `onnxopt optimize` on a local file leaves the write-back to the kernel.
  bool durable_output = true;
  // The job's name, stamped into the delivered model's metadata (model_lineage.h).
  std::string job_name = "local";
};

struct OptimizeResult {
  v1::Report report;
  std::vector<std::filesystem::path> files;  // the optimized model first
};

// Where a job's sessions run: the config's device and threads. CUDA where it cannot run is
// FAILED_PRECONDITION (CUDA_UNAVAILABLE), or with benchmark.allow_cpu_fallback the CPU, flagged in
// `report` (benchmark.fallback and a warning).
absl::StatusOr<SessionSettings> DeviceSettings(const v1::OptimizationConfig& config, v1::Report* report);

// The settings both models are timed under (`device`, ONNX Runtime's optimizations as the config asks,
// all by default, no thread spinning), described in `benchmark`.
SessionSettings BenchmarkSettings(const v1::OptimizationConfig& config, const SessionSettings& device,
                                  v1::BenchmarkReport* benchmark);

// Everything a config can get wrong that is knowable before running: INVALID_ARGUMENT with a reason.
absl::Status CheckConfig(const v1::OptimizationConfig& config);

// Runs the ONNX checker where onnx 1.12 knows the model's opsets; otherwise adds a warning.
absl::Status CheckModel(const onnx::ModelProto& model, std::vector<std::string>* warnings);

// Errors: INVALID_ARGUMENT for models that do not load or check (reason in the message), CANCELLED,
// ABORTED (PARITY_FAILED) when the optimized model does not match the original and the config says
// to fail rather than recover; `report` is then still filled as far as it got, so the caller can keep
// it. A parity failure is otherwise bisected and the best model that passes is returned (the report
// names the culprit passes); a regression can return the original (Report.returned_original).
absl::StatusOr<OptimizeResult> Optimize(const OptimizeRequest& request, v1::Report* partial_report = nullptr);

v1::ModelSummary Summarize(const onnx::ModelProto& model, int64_t model_bytes);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_OPTIMIZE_H_
