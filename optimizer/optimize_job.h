// Optimize (optimize.h) as named stages over the state they hand on: load and check, run the passes,
// apply precision, save, validate, benchmark, deliver. OptimizeJob::Run takes them in order and fails in
// one place, with the report filled as far as the job got; each stage's results are a struct of their own.
// Private to optimize.cc, optimize_validation.cc, optimize_auto_precision.cc and optimize_deliver.cc.
#ifndef ONNXOPT_OPTIMIZER_OPTIMIZE_JOB_H_
#define ONNXOPT_OPTIMIZER_OPTIMIZE_JOB_H_

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/precision.h"
#include "optimizer/transformer_report.h"
#include "optimizer/validation/generation.h"
#include "optimizer/validation/input_generator.h"
#include "optimizer/validation/parity.h"

namespace onnxopt {

// The pipeline's initial shapes (InferInitialShapes), inferred on a thread of their own while the
// model is only read. Joined by Take() or when it goes.
class BackgroundShapes {
 public:
  BackgroundShapes(const onnx::ModelProto& model, bool start);
  BackgroundShapes(const BackgroundShapes&) = delete;
  BackgroundShapes& operator=(const BackgroundShapes&) = delete;
  ~BackgroundShapes();

  bool started() const { return thread_.joinable(); }
  std::optional<InitialShapes> Take();

 private:
  std::optional<InitialShapes> shapes_;
  std::thread thread_;
};

// ONNX Runtime reads a model from memory unless it is too big for one protobuf message.
absl::StatusOr<ModelSource> SourceFor(const std::filesystem::path& path);

class OptimizeJob {
 public:
  explicit OptimizeJob(const OptimizeRequest& request);
  absl::StatusOr<OptimizeResult> Run(v1::Report* partial_report);

 private:
  // The stages (optimize.cc, but Validate: optimize_validation.cc).
  absl::Status LoadAndCheck();
  absl::Status TakeWhatOnnxRuntimeLoads(const absl::Status& checker, std::vector<std::string>* warnings);
  absl::Status RunPasses();
  absl::Status ApplyPrecision();
  absl::Status Save();
  absl::Status Validate();
  absl::Status RunBenchmark();
  // The returned model's last form (optimize_deliver.cc): passes_after, adapters moved into their file.
  absl::Status Deliver();
  // RunBenchmark's parts: how the two sessions are held, and the timing either way.
  bool SessionsSideBySide();
  absl::StatusOr<std::vector<GeneratedInputs>> TimeSideBySide(const ModelSource& optimized_source,
                                                              const SessionSettings& settings);
  absl::StatusOr<std::vector<GeneratedInputs>> TimeAlternating(const ModelSource& optimized_source,
                                                               const SessionSettings& settings);
  // The original does not fit in memory (loaded_.exceeds_memory): the result timed alone.
  absl::Status TimeResultAlone(const ModelSource& optimized_source, const SessionSettings& settings);
  // CUDA's figures beyond the device-resident ones: with host copies, and as a CUDA graph.
  absl::Status TimeOnDevice(Ort::Session& original, Ort::Session& optimized, const ModelSource& optimized_source,
                            const SessionSettings& settings, const std::vector<GeneratedInputs>& inputs,
                            v1::BenchmarkReport* benchmark);

  // The stage's peak and final resident size into the report's memory section.
  void RecordStageMemory(const char* stage, double seconds);
  bool Cancelled() const { return request_.run.Cancelled(); }
  void Progress(Phase phase, const std::string& step = "") const;
  // Cancellation and per-pass progress for the pass manager.
  PassManagerOptions PassOptions() const;
  // The pipeline's runs and then `lower` (the precision passes).
  std::vector<v1::PassReport> AllRuns(const std::vector<v1::PassReport>& lower) const;
  // Writes `model` as the result (replacing what was written before) and describes it in the report.
  absl::Status SaveResult(const onnx::ModelProto& model, const std::vector<v1::PassReport>& runs);
  // The result as ONNX Runtime reads it: from its file (`model` just saved) or in memory, behind
  // Casts to the original's interface where precision changed it.
  absl::StatusOr<ModelSource> SourceOf(const onnx::ModelProto& model, bool saved) const;
  // Where validation and the benchmark run: the config's device, resolved once (a fallback warns once).
  absl::StatusOr<SessionSettings> Device();
  const ModelSource& OriginalSource();
  // The original, for the stages past the passes: RunPasses lets the pipeline take it only when none of them
  // reads it (no validation, benchmark or precision), so whichever of them runs may call this.
  const onnx::ModelProto& Original() const { return *loaded_.original; }
  // `settings` for a session of the original: without prepacked weights where it does not fit in memory.
  SessionSettings ForOriginal(SessionSettings settings) const;

  // Validation's parts (optimize_validation.cc).
  // `model` as ONNX Runtime reads it from `source`, against the reference.
  absl::StatusOr<bool> Judge(const onnx::ModelProto& model, const ModelSource& source, v1::ParityReport* into);
  // The original's greedy generation, traced with the reference session where a quantized decoder may
  // be judged on it (ValidationConfig.judge_generation).
  absl::Status TraceGreedyReference(Ort::Session& original);
  // Token ids supplied with a decoder job: the original's loss on them, taken with its reference session.
  absl::Status ScoreSuppliedTokens(Ort::Session& original);
  // The candidate's perplexity on them against the original's (ValidationConfig.max_perplexity_ratio).
  absl::Status JudgePerplexity(Ort::Session& candidate, v1::ParityReport* into);
  // A quantized decoder whose outputs failed: its greedy generation against the original's decides.
  absl::Status JudgeByGeneration(Ort::Session& candidate, const std::string& precision, v1::ParityReport* into);
  // The original's deviation on the job's device from the CPU fp32 reference, where they differ.
  absl::Status MeasureDeviceNoise();
  // After lower precision failed parity: automatic mixed precision, else float32 (or failure).
  absl::StatusOr<bool> RecoverPrecision(v1::ParityReport* parity);
  // After the pipeline failed parity: the best model without the passes that broke it (or failure).
  absl::Status RecoverByBisection(v1::ParityReport* parity);
  // precision.mode "auto" (optimize_auto_precision.cc): the candidates, the fastest that passes kept.
  struct PrecisionTrial {
    PrecisionMode mode;
    onnx::ModelProto model;
    std::vector<v1::PassReport> runs;
    v1::PrecisionCandidate* described = nullptr;
  };
  absl::Status ChoosePrecision();
  absl::StatusOr<std::vector<std::unique_ptr<Ort::Session>>> JudgeCandidates(std::vector<PrecisionTrial>* candidates,
                                                                              const SessionSettings& settings);
  absl::Status JudgeAndTimeCandidates(std::vector<PrecisionTrial>* candidates);
  // The returned model with `adapter` active (ONNX Runtime's adapter API) against the reference, and
  // with none; ABORTED (PARITY_FAILED) when the adapted model does not match.
  absl::Status CheckAdapter(const onnx::ModelProto& model, const std::string& adapter, v1::AdapterReport* report);
  // Saves what Deliver changed: the adapter file and the model after passes_after.
  absl::Status SaveDelivered(const onnx::ModelProto& returned, const std::vector<v1::PassReport>& runs,
                             const std::optional<std::string>& adapter_bytes);
  // The dims the pipeline freed, checked at other lengths.
  absl::Status CheckFreedDims(v1::ParityReport* parity);

  const OptimizeRequest& request_;
  const v1::OptimizationConfig& config_;
  const std::chrono::steady_clock::time_point start_;
  OptimizeResult result_;
  v1::Report& report_ = result_.report;

  // Made by LoadAndCheck; read by every later stage.
  struct Loaded {
    // The original is gone (moved into the pipeline) when nothing after the passes reads it: see Original().
    std::optional<onnx::ModelProto> original;
    std::string source_producer;  // the input's "producer_name producer_version"
    // The original is bigger than what the job may hold (ModelExceedsMemory): it runs from its mapped files.
    bool exceeds_memory = false;
    std::optional<Pipeline> pipeline;  // its hints' device settled by RunPasses
    std::unique_ptr<BackgroundShapes> initial_shapes;
    std::vector<SuppliedSample> supplied;
  } loaded_;
  // Made by RunPasses and ApplyPrecision (Validate's recovery remakes it): the model returned and how it was made.
  struct Rewritten {
    TransformerEvidence original_evidence;
    onnx::ModelProto optimized;
    std::vector<v1::PassReport> pass_reports, precision_runs;
    bool precision_requested = false;
    onnx::ModelProto fp32_model;  // the pipeline's output, when precision is requested
    PrecisionExtras calibrated;
    bool interface_changed = false;  // keep_io_types off: the result's float interface is float16/bfloat16
  } rewritten_;
  // Made by Save and on first use (OriginalSource(), Device()); read by Validate, RunBenchmark and Deliver.
  struct Saved {
    std::filesystem::path output_path;
    std::vector<std::filesystem::path> model_files;  // what SaveResult wrote last: model.onnx (and its data)
    std::optional<ModelSource> original_source;
    std::optional<absl::StatusOr<SessionSettings>> device;  // first resolved by RunPasses where hints ask for CUDA
  } saved_;
  // Made by Validate (returned_original by RunBenchmark too); read by its judges, ChoosePrecision and Deliver.
  struct Validation {
    SessionSettings reference_settings;  // CPU fp32, ONNX Runtime's rewrites off: the original's reference run
    SessionSettings parity_settings;     // the job's device: candidates (and the original's noise) run here
    std::optional<ParityReference> reference;
    // A quantized decoder's second judge: the original's greedy generation (JudgeByGeneration).
    std::optional<GreedyTrace> greedy_reference;
    // The original's loss on supplied token ids (ScoreSuppliedTokens), or why there is none.
    std::optional<TokenLoss> original_loss;
    std::optional<CacheInterface> scored_cache;  // the interface the supplied tokens were fed through
    std::string loss_note;
    std::optional<CacheInterface> cache;
    v1::GenerationConfig greedy_config;
    // The job returns the original: set by RecoverByBisection or, on a regression, by RunBenchmark; read by
    // Run and Deliver.
    bool returned_original = false;
  } validation_;
};

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_OPTIMIZE_JOB_H_
