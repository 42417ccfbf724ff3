// The latency benchmark: the original and the optimized model timed interleaved in one process,
// after warm-up, in windows of runs until the windows' medians agree (or a run count or time
// budget ends), for every shape set; plus the peak memory a session adds and, on request, a search
// for the fastest ONNX Runtime session settings.
#ifndef ONNXOPT_OPTIMIZER_VALIDATION_BENCHMARK_H_
#define ONNXOPT_OPTIMIZER_VALIDATION_BENCHMARK_H_

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/config.pb.h"
#include "onnxopt/v1/report.pb.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/run_context.h"
#include "optimizer/validation/bound_run.h"
#include "optimizer/validation/input_generator.h"

namespace onnxopt {

inline constexpr int kDefaultWarmupRuns = 5;
inline constexpr double kDefaultTimeBudgetSeconds = 30;
inline constexpr double kDefaultStability = 0.02;
inline constexpr int kDefaultWindowRuns = 20;
inline constexpr int kMaxTimedRuns = 100000;
inline constexpr int kMaxLatencySamples = 2000;
inline constexpr size_t kMinStableWindows = 5;

// BenchmarkConfig.time_budget_seconds, or its default.
double TimeBudget(const v1::BenchmarkConfig& config);

// Checks that a config's benchmark settings make sense (INVALID_ARGUMENT otherwise).
absl::Status CheckBenchmarkSettings(const v1::BenchmarkConfig& config);

// Order statistics of latencies in milliseconds, in the order they were taken (samples_ms keeps at
// most kMaxLatencySamples of them, evenly picked).
v1::LatencyStats Summarize(const std::vector<double>& latencies_ms);

// Every phase a report's benchmark timed (its shape sets, a decoder's generation phases) in which the
// result is slower than the original by more than `band` (the benchmark's stability, 2% by default),
// each with its speedup: "shape 2 (input_ids=1x512) at 0.91x", "decode at batch 1 after 512 at 0.66x".
std::vector<std::string> SlowerPhases(const v1::Report& report, double band);

// The phase that decides which model a job returns (BenchmarkConfig.deciding_phase, its default
// resolved against what the benchmark timed and the result's precision), and whether the optimized
// model is slower there beyond the noise.
struct DecidingPhase {
  std::string name;       // "shape", "prefill" or "decode"
  bool slower = false;
  std::string described;  // "prefill at batch 1 at 0.86x", "the shape sets at 0.93x (p90 0.97x)"
};
DecidingPhase JudgeDecidingPhase(const v1::Report& report, const v1::BenchmarkConfig& config, bool int4_weights,
                                 double band);

// One timed run, in milliseconds: a session run plainly on host tensors, or a bound run.
using TimedRunner = std::function<absl::StatusOr<double>()>;
TimedRunner BoundRunner(BoundRun& run);

// Both runners in turns (each going first every other pair): `warmup_pairs` untimed, then at least
// `min_pairs` and more until `budget_seconds` pass, at most `max_pairs`. Each one's latencies.
absl::StatusOr<std::array<std::vector<double>, 2>> TimeInTurns(const TimedRunner runners[2], int warmup_pairs,
                                                               int min_pairs, double budget_seconds,
                                                               const RunContext& run,
                                                               int max_pairs = kMaxTimedRuns);

// How the benchmark runs each session: plainly (Session::Run on host tensors, the CPU's way), or
// bound (bound_run.h) with inputs and outputs in `residence` for `device`: on CUDA, device-resident
// figures exclude host copies, host-bound ones include them.
struct TimingMode {
  bool bound = false;
  v1::Device device = v1::DEVICE_CPU;
  Residence residence = Residence::kDevice;
};

// How `device` is timed: device-resident bound runs on CUDA, plain runs on the CPU.
TimingMode TimingOn(v1::Device device);

// A runner of `session` on `inputs` as `mode` says; a bound one keeps its binding in `bound`.
absl::StatusOr<TimedRunner> RunnerFor(Ort::Session& session, const GeneratedInputs& inputs,
                                      const std::vector<std::string>& output_names, const TimingMode& mode,
                                      std::unique_ptr<BoundRun>* bound);

// Times both sessions on `inputs` (one entry per shape set); fills shapes, the first shape set's
// figures at the top level, stability and the regression flag. CANCELLED on cancel.
absl::Status Benchmark(Ort::Session& original, Ort::Session& optimized, const std::vector<GeneratedInputs>& inputs,
                       const v1::BenchmarkConfig& config, const RunContext& run,
                       v1::BenchmarkReport* report, const TimingMode& mode = {});

// The optimized model alone on every input set (the original does not fit in memory): its latencies in
// `report`, the original's left empty, no speedup and no regression.
absl::Status BenchmarkAlone(Ort::Session& optimized, const std::vector<GeneratedInputs>& inputs,
                            const v1::BenchmarkConfig& config, const RunContext& run,
                            v1::BenchmarkReport* report, const TimingMode& mode = {});

// Rounds of alternating sessions (BENCHMARK_SESSIONS_ALTERNATING).
inline constexpr int kAlternatingRounds = 3;

// One model's window while its session is open alone: `which` is 0 (the original) or 1, in `round`.
using SessionWindow = std::function<absl::Status(Ort::Session& session, int which, int round)>;

// Opens one model's session at a time, never both: `rounds` rounds, the original's window first in even
// rounds and the optimized model's first in odd ones, so that one session serves two windows in a row
// (A B B A A B: rounds + 1 sessions in all). CANCELLED on cancel.
absl::Status InAlternatingSessions(const ModelSource& original, const ModelSource& optimized,
                                   const SessionSettings& settings, int rounds, const SessionWindow& window,
                                   const RunContext& run);

// `runner` in one window: `warmup` untimed runs, then timed runs until `seconds` pass, at least
// `min_runs` and at most `max_runs`. Its latencies in milliseconds.
absl::StatusOr<std::vector<double>> TimeWindow(const TimedRunner& runner, int warmup, int min_runs, int max_runs,
                                               double seconds, const RunContext& run);

// Benchmark's figures with the two sessions alternating (InAlternatingSessions) instead of open side by
// side: every shape set timed in each window; stability across rounds; the speedup quantiles from the
// k-th runs of the two models' windows of a round.
absl::Status BenchmarkAlternating(const ModelSource& original, const ModelSource& optimized,
                                  const SessionSettings& settings, const std::vector<GeneratedInputs>& inputs,
                                  const v1::BenchmarkConfig& config, const RunContext& run,
                                  v1::BenchmarkReport* report, const TimingMode& mode = {});

// The optimized model replayed as a CUDA graph (ONNX Runtime's enable_cuda_graph) timed in turns
// with its plain device-resident runs on `inputs`, after checking that the replay gives the plain
// runs' outputs. `settings` are the benchmark's; not tried off CUDA, not qualified (with ONNX
// Runtime's reason) where a node cannot run on CUDA or the capture fails. CANCELLED on cancel.
absl::StatusOr<v1::CudaGraphTiming> TimeCudaGraph(const ModelSource& optimized, Ort::Session& plain,
                                                  const SessionSettings& settings, const GeneratedInputs& inputs,
                                                  double budget_seconds, const RunContext& run);

// The same on generated inputs for every shape set of `config.validation()`.
absl::Status Benchmark(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& original_model,
                       const v1::OptimizationConfig& config, const RunContext& run,
                       v1::BenchmarkReport* report);

// One input set per shape set to time on: generated, or from the first supplied set.
absl::StatusOr<std::vector<GeneratedInputs>> BenchmarkInputs(Ort::Session& original, const onnx::ModelProto& original_model,
                                                             const v1::ValidationConfig& config,
                                                             const std::vector<SuppliedSample>& supplied);

// Resident memory a fresh session of `model` adds while it loads and runs once on `inputs`, in
// bytes; UNAVAILABLE where the kernel does not let the process reset its peak (/proc/self/clear_refs).
absl::StatusOr<int64_t> MeasurePeakMemory(const ModelSource& model, const SessionSettings& settings,
                                          const GeneratedInputs& inputs);

// Times `model` under thread counts, sequential/parallel execution and ONNX Runtime's optimization
// levels (briefly each) and names the fastest; `base` gives the device.
absl::StatusOr<v1::SessionTuning> TuneSession(const ModelSource& model, const SessionSettings& base,
                                              const GeneratedInputs& inputs, double budget_seconds,
                                              const RunContext& run);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_VALIDATION_BENCHMARK_H_
