// precision.mode "auto" (optimize_job.h): the pipeline's float32 result, float16 and, on CUDA,
// bfloat16 (ONNX Runtime's CPU provider has few bfloat16 kernels) each judged against the parity
// reference and timed in turns with the float32 one on the job's device, as the benchmark runs it;
// the fastest that passes becomes the result, every candidate in the report. Lower precision is
// worth it where the device has the arithmetic for it (tensor cores); elsewhere its Casts cost more
// than they save, which only measuring tells.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "optimizer/optimize_job.h"
#include "optimizer/validation/benchmark.h"

namespace onnxopt {
namespace {

constexpr int kWarmupPairs = 3;
constexpr int kMinPairs = 10;

}  // namespace

absl::Status OptimizeJob::ChoosePrecision() {
  Progress(Phase::kValidating, "precision candidates");
  v1::PrecisionReport* described = report_.mutable_precision();
  std::vector<PrecisionTrial> candidates(1);
  candidates[0].mode = v1::PrecisionConfig::fp32;
  candidates[0].model = rewritten_.fp32_model;
  std::vector<PrecisionMode> lower = {v1::PrecisionConfig::fp16};
  if (validation_.parity_settings.device == v1::DEVICE_CUDA) lower.push_back(v1::PrecisionConfig::bf16);
  for (const PrecisionMode mode : lower) {
    PrecisionTrial candidate{mode, rewritten_.fp32_model, {}, nullptr};
    v1::PrecisionConfig converting = config_.precision();
    converting.set_mode(mode);
    absl::Status converted = onnxopt::ApplyPrecision(converting, {}, PassOptions(), &candidate.model, &candidate.runs);
    if (!converted.ok()) {
      v1::PrecisionCandidate* failed = described->add_candidates();
      failed->set_mode(v1::PrecisionConfig::Mode_Name(mode));
      failed->set_note(absl::StrCat("conversion failed: ", converted.message()));
      continue;
    }
    candidates.push_back(std::move(candidate));
  }
  for (PrecisionTrial& candidate : candidates) {
    candidate.described = described->add_candidates();
    candidate.described->set_mode(v1::PrecisionConfig::Mode_Name(candidate.mode));
  }
  absl::Status timed = JudgeAndTimeCandidates(&candidates);
  if (!timed.ok()) return timed;
  PrecisionTrial* chosen = &candidates.front();
  for (PrecisionTrial& candidate : candidates) {
    if (candidate.described->passed() && candidate.described->speedup() > chosen->described->speedup()) {
      chosen = &candidate;
    }
  }
  chosen->described->set_chosen(true);
  rewritten_.interface_changed = ChangesFloatInterface(config_.precision(), chosen->mode);
  if (chosen->mode != v1::PrecisionConfig::fp32) {
    rewritten_.optimized = std::move(chosen->model);
    rewritten_.precision_runs = std::move(chosen->runs);
    report_.clear_passes();
    for (const auto& pass_report : AllRuns(rewritten_.precision_runs)) *report_.add_passes() = pass_report;
    if (absl::Status saved = SaveResult(rewritten_.optimized, AllRuns(rewritten_.precision_runs)); !saved.ok()) {
      return saved;
    }
  }
  v1::PrecisionConfig chosen_config = config_.precision();
  chosen_config.set_mode(chosen->mode);
  const auto candidates_described = described->candidates();
  described->Clear();
  DescribePrecision(chosen_config, rewritten_.fp32_model, rewritten_.optimized, rewritten_.precision_runs, described);
  *described->mutable_candidates() = candidates_described;
  described->set_mode(v1::PrecisionConfig::Mode_Name(v1::PrecisionConfig::auto_));
  described->set_note(absl::StrFormat("auto chose %s: %.2fx the float32 model's speed on the job's device",
                                      v1::PrecisionConfig::Mode_Name(chosen->mode), chosen->described->speedup()));
  return absl::OkStatus();
}

// Each candidate judged against the parity reference; the ones that pass get a session on the
// job's device, as the benchmark runs it (null for the others).
absl::StatusOr<std::vector<std::unique_ptr<Ort::Session>>> OptimizeJob::JudgeCandidates(
    std::vector<PrecisionTrial>* candidates, const SessionSettings& settings) {
  std::vector<std::unique_ptr<Ort::Session>> sessions(candidates->size());
  for (size_t i = 0; i < candidates->size(); ++i) {
    PrecisionTrial& candidate = (*candidates)[i];
    rewritten_.interface_changed = ChangesFloatInterface(config_.precision(), candidate.mode);
    absl::StatusOr<ModelSource> source = SourceOf(candidate.model, /*saved=*/false);
    rewritten_.interface_changed = false;
    if (!source.ok()) return source.status();
    v1::ParityReport parity = report_.parity();
    absl::StatusOr<bool> passed = Judge(candidate.model, *source, &parity);
    if (!passed.ok()) return passed.status();
    candidate.described->set_passed(*passed);
    if (!*passed) {
      candidate.described->set_note(absl::StrCat("failed parity: ", WorstOutput(parity)));
      continue;
    }
    absl::StatusOr<std::unique_ptr<Ort::Session>> session = CreateSession(*source, settings);
    if (!session.ok()) {
      candidate.described->set_passed(false);
      candidate.described->set_note(absl::StrCat("does not load for timing: ", session.status().message()));
      continue;
    }
    sessions[i] = *std::move(session);
  }
  return sessions;
}

// The candidates that passed, each timed in turns with the float32 one (its speedup 1), on a third
// of the benchmark budget shared among them.
absl::Status OptimizeJob::JudgeAndTimeCandidates(std::vector<PrecisionTrial>* candidates) {
  v1::BenchmarkReport scratch;
  const SessionSettings settings = BenchmarkSettings(config_, validation_.parity_settings, &scratch);
  absl::StatusOr<std::vector<std::unique_ptr<Ort::Session>>> sessions = JudgeCandidates(candidates, settings);
  if (!sessions.ok()) return sessions.status();
  if (sessions->front() == nullptr) return absl::OkStatus();  // float32 failed: nothing to time against
  const TimingMode mode = TimingOn(settings.device);
  const GeneratedInputs& inputs = validation_.reference->sets.front().inputs;
  const std::vector<std::string> outputs = OutputNames(*sessions->front());
  const double budget = TimeBudget(config_.benchmark()) / 3 / static_cast<double>(candidates->size());
  v1::PrecisionCandidate* fp32 = candidates->front().described;
  fp32->set_speedup(1.0);
  for (size_t i = 1; i < candidates->size(); ++i) {
    if ((*sessions)[i] == nullptr) continue;
    std::unique_ptr<BoundRun> bound[2];
    TimedRunner runners[2];
    Ort::Session* const pair[2] = {sessions->front().get(), (*sessions)[i].get()};
    for (int k = 0; k < 2; ++k) {
      absl::StatusOr<TimedRunner> runner = RunnerFor(*pair[k], inputs, outputs, mode, &bound[k]);
      if (!runner.ok()) return runner.status();
      runners[k] = *std::move(runner);
    }
    v1::PrecisionCandidate* described = (*candidates)[i].described;
    absl::StatusOr<std::array<std::vector<double>, 2>> latencies =
        TimeInTurns(runners, kWarmupPairs, kMinPairs, budget, request_.run);
    if (!latencies.ok()) {
      if (latencies.status().code() == absl::StatusCode::kCancelled) return latencies.status();
      described->set_passed(false);
      described->set_note(std::string(latencies.status().message()));
      continue;
    }
    const double fp32_p50 = Summarize((*latencies)[0]).p50_ms();
    const double p50 = Summarize((*latencies)[1]).p50_ms();
    if (fp32->p50_ms() == 0) fp32->set_p50_ms(fp32_p50);
    described->set_p50_ms(p50);
    if (p50 > 0) described->set_speedup(fp32_p50 / p50);
  }
  return absl::OkStatus();
}

}  // namespace onnxopt
