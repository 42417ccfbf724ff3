#include "optimizer/validation/benchmark.h"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "optimizer/memory_usage.h"
#include "optimizer/validation/parity.h"

namespace onnxopt {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = p / 100.0 * (sorted.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(sorted.size() - 1, low + 1);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return Percentile(values, 50);
}

// Largest relative gap between the medians of the last three windows.
double Drift(const std::vector<double>& medians) {
  if (medians.size() < 3) return std::numeric_limits<double>::infinity();
  const auto last = medians.end() - 3;
  const auto [low, high] = std::minmax_element(last, medians.end());
  return *low > 0 ? (*high - *low) / *low : std::numeric_limits<double>::infinity();
}

// Runs `session` once; its wall time in milliseconds.
absl::StatusOr<double> TimedRun(Ort::Session& session, const GeneratedInputs& inputs,
                                const std::vector<std::string>& output_names) {
  const auto start = Clock::now();
  absl::StatusOr<std::vector<Ort::Value>> outputs = RunOnInputs(session, inputs, output_names);
  if (!outputs.ok()) {
    return absl::InternalError(absl::StrCat("ONNX Runtime failed during the benchmark: ", outputs.status().message()));
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Runs `session` plainly on host tensors.
TimedRunner PlainRunner(Ort::Session& session, const GeneratedInputs& inputs,
                        const std::vector<std::string>& output_names) {
  return [&session, &inputs, &output_names] { return TimedRun(session, inputs, output_names); };
}

// Pair `index` of runs timed in turns: both runners once, the first one going first on even pairs
// so that neither gets a warmer cache. `latencies` gets each one's time.
absl::Status TimedPair(const TimedRunner runners[2], int index, double latencies[2]) {
  for (int k = 0; k < 2; ++k) {
    const int which = index % 2 == 0 ? k : 1 - k;
    absl::StatusOr<double> latency = runners[which]();
    if (!latency.ok()) return latency.status();
    latencies[which] = *latency;
  }
  return absl::OkStatus();
}

// A shape set's figures from each model's latencies, the ratios of runs taken side by side and the
// medians of each window (or round).
void DescribeShapeSet(const std::vector<double> latencies[2], std::vector<double> ratios,
                      const std::vector<double> medians[2], bool stable, v1::ShapeBenchmark* shape) {
  *shape->mutable_original() = Summarize(latencies[0]);
  *shape->mutable_optimized() = Summarize(latencies[1]);
  if (shape->optimized().p50_ms() > 0) shape->set_speedup(shape->original().p50_ms() / shape->optimized().p50_ms());
  std::sort(ratios.begin(), ratios.end());
  shape->set_speedup_p10(Percentile(ratios, 10));
  shape->set_speedup_p90(Percentile(ratios, 90));
  shape->set_stable(stable);
  shape->set_windows(static_cast<int32_t>(medians[0].size()));
  const double drift = std::max(Drift(medians[0]), Drift(medians[1]));
  shape->set_median_drift(std::isfinite(drift) ? drift : -1);
}

// How long and how steadily one shape set is timed (BenchmarkConfig with its defaults).
struct TimingPlan {
  int warmup = kDefaultWarmupRuns;
  bool fixed = false;  // a fixed run count: no early stop
  int target = kMaxTimedRuns;
  double stability = kDefaultStability;
  int window = kDefaultWindowRuns;
};

TimingPlan PlanOf(const v1::BenchmarkConfig& config) {
  TimingPlan plan;
  if (config.warmup_runs() > 0) plan.warmup = config.warmup_runs();
  plan.fixed = config.iterations() > 0;
  if (plan.fixed) plan.target = config.iterations();
  if (config.stability() > 0) plan.stability = config.stability();
  if (config.window_runs() > 0) plan.window = config.window_runs();
  return plan;
}

// Times both runners on one shape set, in windows of pairs until the windows' medians agree or
// `share` seconds pass; fills `shape` but its input shapes.
absl::Status TimeShapeSet(const TimedRunner runners[2], const TimingPlan& plan, double share,
                          const RunContext& run, v1::ShapeBenchmark* shape) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(share));
  for (int i = 0; i < plan.warmup; ++i) {
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<double> latency = runners[k]();
      if (!latency.ok()) return latency.status();
    }
  }
  std::vector<double> latencies[2], ratios, medians[2];
  int runs = 0;
  bool stable = false;
  // Three agreeing windows can happen by chance in a quiet second: settling also needs a few more
  // windows and a third of this shape's budget (at most 5 s) of timing.
  const auto settle_after =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(5.0, share / 3)));
  while (runs < plan.target) {
    std::vector<double> window_latencies[2];
    for (int i = 0; i < plan.window && runs < plan.target; ++i, ++runs) {
      if (absl::Status stop = run.CheckNotCancelled("during the benchmark"); !stop.ok()) return stop;
      double pair[2];
      if (absl::Status timed = TimedPair(runners, runs, pair); !timed.ok()) return timed;
      for (int which = 0; which < 2; ++which) {
        latencies[which].push_back(pair[which]);
        window_latencies[which].push_back(pair[which]);
      }
      if (pair[1] > 0) ratios.push_back(pair[0] / pair[1]);
    }
    for (int k = 0; k < 2; ++k) medians[k].push_back(Median(window_latencies[k]));
    stable = std::max(Drift(medians[0]), Drift(medians[1])) <= plan.stability;
    if (!plan.fixed && stable && medians[0].size() >= kMinStableWindows && Clock::now() >= settle_after) break;
    if (Clock::now() > deadline && runs >= std::min(plan.target, 10)) break;
  }
  DescribeShapeSet(latencies, std::move(ratios), medians, stable, shape);
  return absl::OkStatus();
}

// The report's top level from its shape sets: the first set's figures, stability, the regression flag
// and the settings that ran.
void DescribeBenchmark(const TimingPlan& plan, const v1::BenchmarkConfig& config, const TimingMode& mode,
                       v1::BenchmarkReport* report) {
  bool all_stable = true, regression = false;
  for (const v1::ShapeBenchmark& shape : report->shapes()) {
    all_stable &= shape.stable();
    // Slower beyond the noise: the median says slower and so do nine in ten side-by-side pairs.
    regression |= shape.speedup() < 1.0 && shape.speedup_p90() < 1.0;
  }
  if (report->shapes_size() > 0) {
    const v1::ShapeBenchmark& first = report->shapes(0);
    *report->mutable_original() = first.original();
    *report->mutable_optimized() = first.optimized();
    report->set_speedup(first.speedup());
    report->set_speedup_p10(first.speedup_p10());
    report->set_speedup_p90(first.speedup_p90());
  }
  report->set_stable(all_stable);
  report->set_regression(regression);
  report->set_warmup_runs(plan.warmup);
  report->set_intra_op_threads(config.intra_op_threads());
  report->set_onnxruntime_version(OrtVersion());
  report->set_device_resident(mode.bound && mode.residence == Residence::kDevice && mode.device == v1::DEVICE_CUDA);
}

}  // namespace

double TimeBudget(const v1::BenchmarkConfig& config) {
  return config.time_budget_seconds() > 0 ? config.time_budget_seconds() : kDefaultTimeBudgetSeconds;
}

absl::Status CheckBenchmarkSettings(const v1::BenchmarkConfig& config) {
  if (config.warmup_runs() < 0 || config.warmup_runs() > 10000 || config.iterations() < 0 ||
      config.iterations() > kMaxTimedRuns) {
    return absl::InvalidArgumentError(absl::StrCat("benchmark.warmup_runs must be in [0, 10000] and benchmark.iterations in [0, ",
                                                   kMaxTimedRuns, "]"));
  }
  if (!(config.time_budget_seconds() >= 0 && config.time_budget_seconds() <= 3600)) {
    return absl::InvalidArgumentError("benchmark.time_budget_seconds must be between 0 and 3600");
  }
  if (config.intra_op_threads() < 0 || config.intra_op_threads() > 1024) {
    return absl::InvalidArgumentError("benchmark.intra_op_threads must be between 0 and 1024");
  }
  if (!(config.stability() >= 0 && config.stability() < 1)) {
    return absl::InvalidArgumentError("benchmark.stability must be in [0, 1) (0 for the default 0.02)");
  }
  if (config.window_runs() < 0 || config.window_runs() > 1000) {
    return absl::InvalidArgumentError("benchmark.window_runs must be between 1 and 1000 (0 for the default)");
  }
  if (!v1::Device_IsValid(config.device()) || !v1::RegressionAction_IsValid(config.on_regression()) ||
      !v1::OrtOptimizationLevel_IsValid(config.ort_optimization_level()) ||
      !v1::BenchmarkSessions_IsValid(config.sessions())) {
    return absl::InvalidArgumentError(
        "benchmark.device, benchmark.on_regression, benchmark.ort_optimization_level or benchmark.sessions is unknown");
  }
  const std::string& deciding = config.deciding_phase();
  if (!deciding.empty() && deciding != "shape" && deciding != "prefill" && deciding != "decode") {
    return absl::InvalidArgumentError(absl::StrCat("benchmark.deciding_phase \"", deciding,
                                                   "\" is unknown: \"shape\", \"prefill\" or \"decode\""));
  }
  return absl::OkStatus();
}

v1::LatencyStats Summarize(const std::vector<double>& latencies_ms) {
  v1::LatencyStats stats;
  if (latencies_ms.empty()) return stats;
  std::vector<double> sorted = latencies_ms;
  std::sort(sorted.begin(), sorted.end());
  const double n = static_cast<double>(sorted.size());
  const double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / n;
  double variance = 0;
  for (double latency : sorted) variance += (latency - mean) * (latency - mean);
  stats.set_runs(static_cast<int32_t>(sorted.size()));
  stats.set_p50_ms(Percentile(sorted, 50));
  stats.set_p90_ms(Percentile(sorted, 90));
  stats.set_p95_ms(Percentile(sorted, 95));
  stats.set_p99_ms(Percentile(sorted, 99));
  stats.set_mean_ms(mean);
  stats.set_stddev_ms(n > 1 ? std::sqrt(variance / (n - 1)) : 0);
  stats.set_min_ms(sorted.front());
  stats.set_max_ms(sorted.back());
  stats.set_throughput_per_second(mean > 0 ? 1000.0 / mean : 0);
  const size_t keep = std::min<size_t>(latencies_ms.size(), kMaxLatencySamples);
  for (size_t i = 0; i < keep; ++i) stats.add_samples_ms(latencies_ms[i * latencies_ms.size() / keep]);
  return stats;
}

TimedRunner BoundRunner(BoundRun& run) {
  return [&run]() -> absl::StatusOr<double> {
    const auto start = Clock::now();
    if (absl::Status ran = run.Run(); !ran.ok()) {
      return absl::InternalError(absl::StrCat("ONNX Runtime failed during the benchmark: ", ran.message()));
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
}

TimingMode TimingOn(v1::Device device) {
  TimingMode mode;
  mode.bound = device == v1::DEVICE_CUDA;
  mode.device = device;
  return mode;
}

absl::StatusOr<TimedRunner> RunnerFor(Ort::Session& session, const GeneratedInputs& inputs,
                                      const std::vector<std::string>& output_names, const TimingMode& mode,
                                      std::unique_ptr<BoundRun>* bound) {
  if (!mode.bound) return PlainRunner(session, inputs, output_names);
  absl::StatusOr<std::unique_ptr<BoundRun>> run =
      BoundRun::Create(session, inputs, output_names, mode.device, mode.residence);
  if (!run.ok()) return run.status();
  *bound = *std::move(run);
  return BoundRunner(**bound);
}

absl::StatusOr<std::array<std::vector<double>, 2>> TimeInTurns(const TimedRunner runners[2], int warmup_pairs,
                                                               int min_pairs, double budget_seconds,
                                                               const RunContext& run, int max_pairs) {
  std::array<std::vector<double>, 2> latencies;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget_seconds));
  const int most = warmup_pairs + std::min(max_pairs, kMaxTimedRuns);
  for (int i = 0; i < warmup_pairs + min_pairs || (Clock::now() < deadline && i < most); ++i) {
    if (absl::Status stop = run.CheckNotCancelled("during the benchmark"); !stop.ok()) return stop;
    double pair[2];
    if (absl::Status timed = TimedPair(runners, i, pair); !timed.ok()) return timed;
    if (i < warmup_pairs) continue;
    for (int which = 0; which < 2; ++which) latencies[which].push_back(pair[which]);
  }
  return latencies;
}

absl::Status Benchmark(Ort::Session& original, Ort::Session& optimized, const std::vector<GeneratedInputs>& inputs,
                       const v1::BenchmarkConfig& config, const RunContext& run,
                       v1::BenchmarkReport* report, const TimingMode& mode) {
  const TimingPlan plan = PlanOf(config);
  const double budget = TimeBudget(config);
  const std::vector<std::string> outputs = OutputNames(original);
  Ort::Session* const sessions[2] = {&original, &optimized};
  const auto start = Clock::now();
  for (size_t set = 0; set < inputs.size(); ++set) {
    // Each shape set gets an equal share of what is left of the budget.
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double share = std::max(0.0, budget - elapsed) / static_cast<double>(inputs.size() - set);
    std::unique_ptr<BoundRun> bound[2];
    TimedRunner runners[2];
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<TimedRunner> runner = RunnerFor(*sessions[k], inputs[set], outputs, mode, &bound[k]);
      if (!runner.ok()) return runner.status();
      runners[k] = *std::move(runner);
    }
    v1::ShapeBenchmark* shape = report->add_shapes();
    shape->mutable_input_shapes()->insert(inputs[set].shapes.begin(), inputs[set].shapes.end());
    if (absl::Status timed = TimeShapeSet(runners, plan, share, run, shape); !timed.ok()) return timed;
  }
  DescribeBenchmark(plan, config, mode, report);
  return absl::OkStatus();
}

absl::Status InAlternatingSessions(const ModelSource& original, const ModelSource& optimized,
                                   const SessionSettings& settings, int rounds, const SessionWindow& window,
                                   const RunContext& run) {
  const ModelSource* const models[2] = {&original, &optimized};
  std::unique_ptr<Ort::Session> session;
  int open = -1;  // whose session is open
  for (int round = 0; round < rounds; ++round) {
    for (int turn = 0; turn < 2; ++turn) {
      if (absl::Status stop = run.CheckNotCancelled("during the benchmark"); !stop.ok()) return stop;
      const int which = round % 2 == 0 ? turn : 1 - turn;
      if (which != open) {
        session.reset();  // the other model's session goes before this one opens
        absl::StatusOr<std::unique_ptr<Ort::Session>> opened = CreateSession(*models[which], settings);
        if (!opened.ok()) return opened.status();
        session = *std::move(opened);
        open = which;
      }
      if (absl::Status done = window(*session, which, round); !done.ok()) return done;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> TimeWindow(const TimedRunner& runner, int warmup, int min_runs, int max_runs,
                                               double seconds, const RunContext& run) {
  for (int i = 0; i < warmup; ++i) {
    if (absl::StatusOr<double> latency = runner(); !latency.ok()) return latency.status();
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<double> latencies;
  while (static_cast<int>(latencies.size()) < max_runs &&
         (static_cast<int>(latencies.size()) < min_runs || Clock::now() < deadline)) {
    if (absl::Status stop = run.CheckNotCancelled("during the benchmark"); !stop.ok()) return stop;
    absl::StatusOr<double> latency = runner();
    if (!latency.ok()) return latency.status();
    latencies.push_back(*latency);
  }
  return latencies;
}

absl::Status BenchmarkAlternating(const ModelSource& original, const ModelSource& optimized,
                                  const SessionSettings& settings, const std::vector<GeneratedInputs>& inputs,
                                  const v1::BenchmarkConfig& config, const RunContext& run,
                                  v1::BenchmarkReport* report, const TimingMode& mode) {
  const TimingPlan plan = PlanOf(config);
  const int rounds = kAlternatingRounds;
  // Each window shares its part of the budget among the shape sets; a fixed run count is split over rounds.
  const double per_set = TimeBudget(config) / (2.0 * rounds) / static_cast<double>(std::max<size_t>(1, inputs.size()));
  const int max_runs = plan.fixed ? std::max(1, (plan.target + rounds - 1) / rounds) : kMaxTimedRuns;
  const int min_runs = std::min(max_runs, 3);
  const int warmup = (plan.warmup + rounds - 1) / rounds;  // the warm-up runs spread over the windows
  // [set][model][round]: each window's latencies.
  std::vector<std::array<std::vector<std::vector<double>>, 2>> timed(inputs.size());
  for (auto& set : timed) set = {std::vector<std::vector<double>>(rounds), std::vector<std::vector<double>>(rounds)};
  const SessionWindow window = [&](Ort::Session& session, int which, int round) -> absl::Status {
    const std::vector<std::string> outputs = OutputNames(session);
    for (size_t set = 0; set < inputs.size(); ++set) {
      std::unique_ptr<BoundRun> bound;
      absl::StatusOr<TimedRunner> runner = RunnerFor(session, inputs[set], outputs, mode, &bound);
      if (!runner.ok()) return runner.status();
      absl::StatusOr<std::vector<double>> latencies = TimeWindow(*runner, warmup, min_runs, max_runs, per_set, run);
      if (!latencies.ok()) return latencies.status();
      timed[set][which][round] = *std::move(latencies);
    }
    return absl::OkStatus();
  };
  if (absl::Status ran = InAlternatingSessions(original, optimized, settings, rounds, window, run); !ran.ok()) {
    return ran;
  }
  for (size_t set = 0; set < inputs.size(); ++set) {
    std::vector<double> latencies[2], ratios, medians[2];
    for (int round = 0; round < rounds; ++round) {
      const std::vector<double>* windows[2] = {&timed[set][0][round], &timed[set][1][round]};
      for (int k = 0; k < 2; ++k) {
        latencies[k].insert(latencies[k].end(), windows[k]->begin(), windows[k]->end());
        medians[k].push_back(Median(*windows[k]));
      }
      for (size_t i = 0; i < windows[0]->size() && i < windows[1]->size(); ++i) {
        if ((*windows[1])[i] > 0) ratios.push_back((*windows[0])[i] / (*windows[1])[i]);
      }
    }
    v1::ShapeBenchmark* shape = report->add_shapes();
    shape->mutable_input_shapes()->insert(inputs[set].shapes.begin(), inputs[set].shapes.end());
    const bool stable = std::max(Drift(medians[0]), Drift(medians[1])) <= plan.stability;
    DescribeShapeSet(latencies, std::move(ratios), medians, stable, shape);
  }
  DescribeBenchmark(plan, config, mode, report);
  return absl::OkStatus();
}

absl::Status BenchmarkAlone(Ort::Session& optimized, const std::vector<GeneratedInputs>& inputs,
                            const v1::BenchmarkConfig& config, const RunContext& run,
                            v1::BenchmarkReport* report, const TimingMode& mode) {
  const TimingPlan plan = PlanOf(config);
  const double per_set = TimeBudget(config) / static_cast<double>(std::max<size_t>(1, inputs.size()));
  const int max_runs = plan.fixed ? plan.target : kMaxTimedRuns;
  const std::vector<std::string> outputs = OutputNames(optimized);
  for (const GeneratedInputs& set : inputs) {
    std::unique_ptr<BoundRun> bound;
    absl::StatusOr<TimedRunner> runner = RunnerFor(optimized, set, outputs, mode, &bound);
    if (!runner.ok()) return runner.status();
    absl::StatusOr<std::vector<double>> latencies =
        TimeWindow(*runner, plan.warmup, std::min(max_runs, 3), max_runs, per_set, run);
    if (!latencies.ok()) return latencies.status();
    v1::ShapeBenchmark* shape = report->add_shapes();
    shape->mutable_input_shapes()->insert(set.shapes.begin(), set.shapes.end());
    *shape->mutable_optimized() = Summarize(*latencies);
    // Stable when the medians of the run's thirds agree, as the windows of a side-by-side run must.
    std::vector<double> medians;
    const size_t third = std::max<size_t>(1, latencies->size() / 3);
    for (size_t at = 0; at + third <= latencies->size(); at += third) {
      medians.push_back(Median(std::vector<double>(latencies->begin() + static_cast<std::ptrdiff_t>(at),
                                                   latencies->begin() + static_cast<std::ptrdiff_t>(at + third))));
    }
    shape->set_stable(Drift(medians) <= plan.stability);
  }
  DescribeBenchmark(plan, config, mode, report);
  report->set_regression(false);  // nothing to be slower than
  return absl::OkStatus();
}

absl::Status Benchmark(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& original_model,
                       const v1::OptimizationConfig& config, const RunContext& run,
                       v1::BenchmarkReport* report) {
  absl::StatusOr<std::vector<GeneratedInputs>> inputs = BenchmarkInputs(original, original_model, config.validation(), {});
  if (!inputs.ok()) return inputs.status();
  return Benchmark(original, optimized, *inputs, config.benchmark(), run, report);
}

absl::StatusOr<std::vector<GeneratedInputs>> BenchmarkInputs(Ort::Session& original, const onnx::ModelProto& original_model,
                                                             const v1::ValidationConfig& config,
                                                             const std::vector<SuppliedSample>& supplied) {
  std::vector<GeneratedInputs> inputs;
  for (const DimValues& dims : InputShapeSets(config, !supplied.empty(), original_model)) {
    absl::StatusOr<GeneratedInputs> generated =
        GenerateInputs(original, original_model, config, dims, 0, supplied.empty() ? nullptr : &supplied.front());
    if (!generated.ok()) return generated.status();
    inputs.push_back(*std::move(generated));
  }
  return inputs;
}

absl::StatusOr<int64_t> MeasurePeakMemory(const ModelSource& model, const SessionSettings& settings,
                                          const GeneratedInputs& inputs) {
  // Hand freed heap pages back first, or this session would reuse what an earlier one left and
  // look free.
  malloc_trim(0);
  if (!ResetResidentPeak()) return absl::UnavailableError("cannot reset the peak resident size");
  const std::optional<int64_t> before = ResidentBytes();
  {
    absl::StatusOr<std::unique_ptr<Ort::Session>> session = CreateSession(model, settings);
    if (!session.ok()) return session.status();
    absl::StatusOr<double> ran = TimedRun(**session, inputs, OutputNames(**session));
    if (!ran.ok()) return ran.status();
  }
  const std::optional<int64_t> peak = ProcStatusBytes("VmHWM");
  if (!before || !peak) return absl::UnavailableError("cannot read the resident size");
  return std::max<int64_t>(0, *peak - *before);
}

absl::StatusOr<v1::SessionTuning> TuneSession(const ModelSource& model, const SessionSettings& base,
                                              const GeneratedInputs& inputs, double budget_seconds,
                                              const RunContext& run) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> threads = {0, 1};
  if (cores / 2 > 1) threads.push_back(cores / 2);
  if (cores > 1) threads.push_back(cores);
  const GraphOptimizationLevel levels[] = {ORT_ENABLE_BASIC, ORT_ENABLE_EXTENDED, ORT_ENABLE_ALL};
  const size_t trials = threads.size() * 2 * 3;
  const double per_trial = std::max(0.05, budget_seconds / static_cast<double>(trials));
  v1::SessionTuning tuning;
  double default_p50 = 0;
  for (GraphOptimizationLevel level : levels) {
    for (int count : threads) {
      for (bool parallel : {false, true}) {
        if (absl::Status stop = run.CheckNotCancelled("during session tuning"); !stop.ok()) return stop;
        v1::TuningTrial* trial = tuning.add_trials();
        trial->set_intra_op_threads(count);
        trial->set_execution_mode(parallel ? "parallel" : "sequential");
        trial->set_optimization_level(OrtLevelName(level));
        SessionSettings settings = base;
        settings.intra_op_threads = count;
        settings.parallel_execution = parallel;
        settings.optimization_level = level;
        absl::StatusOr<std::unique_ptr<Ort::Session>> session = CreateSession(model, settings);
        if (!session.ok()) {
          trial->set_error(std::string(session.status().message()));
          continue;
        }
        const std::vector<std::string> outputs = OutputNames(**session);
        std::vector<double> latencies;
        const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(per_trial));
        for (int i = 0; i < 200 && (i < 5 || Clock::now() < deadline); ++i) {
          absl::StatusOr<double> latency = TimedRun(**session, inputs, outputs);
          if (!latency.ok()) {
            trial->set_error(std::string(latency.status().message()));
            break;
          }
          if (i >= 2) latencies.push_back(*latency);  // the first runs warm up
        }
        if (!trial->error().empty() || latencies.empty()) continue;
        trial->set_p50_ms(Median(latencies));
        if (!tuning.has_best() || trial->p50_ms() < tuning.best().p50_ms()) *tuning.mutable_best() = *trial;
        if (level == ORT_ENABLE_ALL && count == 0 && !parallel) default_p50 = trial->p50_ms();
      }
    }
  }
  if (!tuning.has_best()) return absl::InternalError("no session settings could run the model");
  if (default_p50 <= 0) return tuning;
  // Brief one-after-another trials are noisy: confirm the winner against the defaults side by side.
  SessionSettings best = base, defaults = base;
  best.intra_op_threads = tuning.best().intra_op_threads();
  best.parallel_execution = tuning.best().execution_mode() == "parallel";
  for (GraphOptimizationLevel level : levels) {
    if (OrtLevelName(level) == tuning.best().optimization_level()) best.optimization_level = level;
  }
  defaults.intra_op_threads = 0;
  defaults.parallel_execution = false;
  defaults.optimization_level = ORT_ENABLE_ALL;
  best.allow_spinning = defaults.allow_spinning = false;  // timed in turns
  auto best_session = CreateSession(model, best);
  auto default_session = CreateSession(model, defaults);
  if (!best_session.ok() || !default_session.ok()) return tuning;
  const std::vector<std::string> outputs = OutputNames(**best_session);
  const TimedRunner runners[2] = {PlainRunner(**default_session, inputs, outputs),
                                  PlainRunner(**best_session, inputs, outputs)};
  absl::StatusOr<std::array<std::vector<double>, 2>> latencies = TimeInTurns(runners, 4, 56, 0, run);
  if (!latencies.ok()) return tuning;
  const double gain = Median((*latencies)[0]) / Median((*latencies)[1]);
  if (gain < 1.0) {
    // Not better in the end: the defaults stay.
    for (const auto& trial : tuning.trials()) {
      if (trial.intra_op_threads() == 0 && trial.execution_mode() == "sequential" && trial.optimization_level() == "all") {
        *tuning.mutable_best() = trial;
      }
    }
    tuning.set_gain(1.0);
  } else {
    tuning.set_gain(gain);
  }
  return tuning;
}

std::vector<std::string> SlowerPhases(const v1::Report& report, double band) {
  std::vector<std::string> slower;
  const v1::BenchmarkReport& benchmark = report.benchmark();
  for (int i = 0; i < benchmark.shapes_size(); ++i) {
    const v1::ShapeBenchmark& shape = benchmark.shapes(i);
    if (shape.speedup() <= 0 || shape.speedup() >= 1 - band) continue;
    std::vector<std::string> dims;
    for (const auto& [input, dims_text] : shape.input_shapes()) dims.push_back(absl::StrCat(input, "=", dims_text));
    std::sort(dims.begin(), dims.end());
    slower.push_back(absl::StrFormat("shape %d (%s) at %.2fx", i + 1, absl::StrJoin(dims, ", "), shape.speedup()));
  }
  for (const v1::GenerationPhase& phase : report.generation().phases()) {
    if (!phase.error().empty() || phase.speedup() <= 0 || phase.speedup() >= 1 - band) continue;
    slower.push_back(absl::StrFormat("%s at batch %d%s at %.2fx", phase.phase(), phase.batch(),
                                     phase.past() > 0 ? absl::StrCat(" after ", phase.past()) : "", phase.speedup()));
  }
  return slower;
}

namespace {

// A decoder's first timed phase of that name, if the benchmark ran it.
const v1::GenerationPhase* FirstPhaseNamed(const v1::Report& report, absl::string_view name) {
  for (const v1::GenerationPhase& phase : report.generation().phases()) {
    if (phase.phase() == name && phase.error().empty() && phase.speedup() > 0) return &phase;
  }
  return nullptr;
}

}  // namespace

DecidingPhase JudgeDecidingPhase(const v1::Report& report, const v1::BenchmarkConfig& config, bool int4_weights,
                                 double band) {
  std::string wanted = config.deciding_phase();
  if (wanted.empty()) wanted = int4_weights && FirstPhaseNamed(report, "decode") ? "decode" : "prefill";
  DecidingPhase decided;
  if (const v1::GenerationPhase* phase = wanted == "shape" ? nullptr : FirstPhaseNamed(report, wanted)) {
    decided.name = wanted;
    decided.slower = phase->speedup() < 1 - band;
    decided.described = absl::StrFormat("%s at batch %d%s at %.2fx", phase->phase(), phase->batch(),
                                        phase->past() > 0 ? absl::StrCat(" after ", phase->past()) : "",
                                        phase->speedup());
    return decided;
  }
  const v1::BenchmarkReport& benchmark = report.benchmark();
  decided.name = "shape";
  decided.slower = benchmark.regression();
  decided.described = absl::StrFormat("the shape sets at %.3fx (90%% of side-by-side runs below %.3fx)",
                                      benchmark.speedup(), benchmark.speedup_p90());
  return decided;
}

}  // namespace onnxopt
