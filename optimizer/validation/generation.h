// Generation with a key/value cache (cache_interface.h), as a deployed decoder runs: a prefill of the
// prompt (no past), then one token per step with the presents fed back as the past. Both models are
// timed per phase side by side (the one-shot benchmark times neither phase as it runs), and a greedy
// generation is run by both and compared token by token.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_GENERATION_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_GENERATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/cache_interface.h"
#include "optimizer/run_context.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/input_generator.h"
#include "onnxruntime_cxx_api.h"

namespace onnxopt {

inline constexpr int kDefaultPrefillTokens = 128;
inline constexpr int kDefaultGreedyTokens = 64;
inline constexpr int kDefaultPromptTokens = 16;
inline constexpr int kDefaultGenerationRuns = 20;
inline constexpr double kMinLowerPrecisionCosine = 0.99;

// The config's generation settings with defaults filled in; INVALID_ARGUMENT for values out of range.
absl::StatusOr<v1::GenerationConfig> ResolveGenerationConfig(const v1::GenerationConfig& config);

// Inputs of one step: `batch` rows of `new_tokens` tokens after a past of `past`, every other input
// generated as validation does (no mask padding).
absl::StatusOr<GeneratedInputs> StepInputs(Ort::Session& session, const onnx::ModelProto& model,
                                           const CacheInterface& cache, int64_t batch, int64_t past,
                                           int64_t new_tokens, int sample);

// Times prefill and decode phases of both sessions (interleaved; each phase an equal share of what is
// left of `budget_seconds`, at least 3 and at most config.runs() pairs), then runs the greedy
// comparison. `exact_tokens`: the optimized model computes in fp32 and must pick every token the
// original picks; else its logits must keep a cosine >= kMinLowerPrecisionCosine. CANCELLED on cancel.
absl::StatusOr<v1::GenerationReport> BenchmarkGeneration(Ort::Session& original, Ort::Session& optimized,
                                                         const onnx::ModelProto& original_model,
                                                         const CacheInterface& cache,
                                                         const v1::GenerationConfig& config, bool exact_tokens,
                                                         double budget_seconds, const TimingMode& mode,
                                                         const RunContext& run);

// One model's greedy generation from the comparison's prompt (two rows, the second left-padded): the
// last position's logits of every row at each step.
struct GreedyTrace {
  std::vector<std::vector<std::vector<float>>> logits;  // [step][row][vocabulary]
  std::vector<int64_t> prompt_ids;                       // [row * prompt + position]
  std::vector<std::vector<int64_t>> prompt_mask;         // [row][position]
};

// The original's greedy generation, kept to judge candidates by (CompareToGreedyTrace).
absl::StatusOr<GreedyTrace> TraceOriginalGreedy(Ort::Session& original, const onnx::ModelProto& original_model,
                                                const CacheInterface& cache, const v1::GenerationConfig& config);

// A model's greedy generation on its own picks.
absl::StatusOr<GreedyTrace> TraceOwnGreedy(Ort::Session& session, const onnx::ModelProto& original_model,
                                           const CacheInterface& cache, const v1::GenerationConfig& config);

// `picks` (another model's greedy generation) scored by `scorer` in one pass without a past: the prompt and
// every pick but the last as one sequence, the logits at each step's position as a trace — the same
// teacher-forced comparison on `picks`' tokens, with one run of the scorer instead of one per step. For
// an original larger than memory, whose every run reads its weights from the disk. FAILED_PRECONDITION
// (GENERATION_UNSUPPORTED) where the logits do not cover every position.
absl::StatusOr<GreedyTrace> ScoreGreedyTrace(Ort::Session& scorer, const onnx::ModelProto& original_model,
                                             const CacheInterface& cache, const v1::GenerationConfig& config,
                                             const GreedyTrace& picks);

// The greedy fields of `report` from the reference's and the compared model's traces, step by step
// (tokens, logits cosine, KL divergence): `exact_tokens` asks for every pick the same, else a cosine of at
// least kMinLowerPrecisionCosine.
void CompareGreedyTraces(const GreedyTrace& reference, const GreedyTrace& compared, bool exact_tokens,
                         v1::GenerationReport* report);

// The negative log-likelihood of supplied token ids, teacher-forced: each input set of `samples` that
// holds the cache's ids input ([batch, sequence]; its mask too where given, else all kept) runs once
// without a past, and every position whose next token the mask keeps adds -log p(next token).
struct TokenLoss {
  double nll = 0;
  int64_t tokens = 0;
  double Perplexity() const;
};
// FAILED_PRECONDITION (GENERATION_UNSUPPORTED) where no set holds token ids or the logits do not cover
// every position; INVALID_ARGUMENT (INPUT_INVALID) for ids that are not a [batch, sequence] integer tensor
// within the vocabulary.
absl::StatusOr<TokenLoss> SuppliedTokenLoss(Ort::Session& session, const onnx::ModelProto& original_model,
                                            const CacheInterface& cache, const std::vector<SuppliedSample>& samples);

// `candidate` generating with each step teacher-forced on `reference`'s pick: `report`'s greedy fields,
// as a lower-precision model is compared (logits cosine, KL divergence, top-1 agreement per step).
absl::Status CompareToGreedyTrace(Ort::Session& candidate, const onnx::ModelProto& original_model,
                                  const CacheInterface& cache, const v1::GenerationConfig& config,
                                  const GreedyTrace& reference, v1::GenerationReport* report);

// The greedy comparison alone (part of BenchmarkGeneration), filling `report`'s greedy fields.
absl::Status CompareGreedyGeneration(Ort::Session& original, Ort::Session& optimized,
                                     const onnx::ModelProto& original_model, const CacheInterface& cache,
                                     const v1::GenerationConfig& config, bool exact_tokens,
                                     v1::GenerationReport* report);

// BenchmarkGeneration with the two sessions alternating (InAlternatingSessions) instead of open side by
// side: each phase timed in every window; the greedy check runs the original in the first window and
// replays its picks on the result in the second.
absl::StatusOr<v1::GenerationReport> BenchmarkGenerationAlternating(
    const ModelSource& original, const ModelSource& optimized, const SessionSettings& settings,
    const onnx::ModelProto& original_model, const CacheInterface& cache, const v1::GenerationConfig& config,
    bool exact_tokens, double budget_seconds, const TimingMode& mode, const RunContext& run);

// Opens a session of the original when it is needed (and only then).
using OriginalOpener = std::function<absl::StatusOr<std::unique_ptr<Ort::Session>>()>;

// The optimized model's phases timed alone (a window each, on the budget), for an original that does
// not fit in memory: no original figures, no speedup. The greedy check runs the optimized model on its
// own picks and has the original score them in one pass (`open_original`), the note saying so.
absl::StatusOr<v1::GenerationReport> TimeGenerationAlone(Ort::Session& optimized, const onnx::ModelProto& original_model,
                                                         const CacheInterface& cache,
                                                         const v1::GenerationConfig& config, bool exact_tokens,
                                                         double budget_seconds, const TimingMode& mode,
                                                         const RunContext& run,
                                                         const OriginalOpener& open_original);

// What a generation report needs beside the sessions it times: the original model (its cache interface and
// inputs), the job's benchmark settings (the generation config, the time budget), how runs are timed, and how
// strictly the result's greedy tokens must follow the original's.
struct GenerationCheck {
  const onnx::ModelProto& original_model;
  const v1::BenchmarkConfig& config;
  TimingMode mode;
  // A float32 result's greedy tokens must match the original's exactly; a lower precision's are scored by the
  // original instead (ExactTokensFor).
  bool exact_tokens = true;
};

// GenerationCheck.exact_tokens for `result`: whether it computes in float32 (ModelPrecision).
bool ExactTokensFor(const onnx::ModelProto& result);

// Where `check.original_model` has a cache and the generation is not skipped: BenchmarkGeneration into
// report->generation (the phases on the benchmark's time budget, time_budget_seconds), with a warning where the
// greedy check fails. Nothing for other models.
absl::Status ReportGeneration(Ort::Session& original, Ort::Session& optimized, const GenerationCheck& check,
                              const RunContext& run, v1::Report* report);
// The same for the optimized model alone (TimeGenerationAlone).
absl::Status ReportGenerationOfResult(Ort::Session& optimized, const OriginalOpener& open_original,
                                      const GenerationCheck& check, const RunContext& run, v1::Report* report);
// The same with the sessions alternating (BenchmarkGenerationAlternating).
absl::Status ReportGenerationAlternating(const ModelSource& original, const ModelSource& optimized,
                                         const SessionSettings& settings, const GenerationCheck& check,
                                         const RunContext& run, v1::Report* report);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_GENERATION_H_
