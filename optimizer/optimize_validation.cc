// Optimize's validation stage (optimize_job.h): parity of the result against the original in ONNX
// Runtime and, when it fails, recovery (automatic mixed precision or float32 for lower precision, a
// bisection of the pipeline for the passes), then the dims the pipeline freed at other lengths.
#include <chrono>
#include <cmath>
#include <map>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "optimizer/cache_interface.h"
#include "optimizer/failure.h"
#include "optimizer/graph.h"
#include "optimizer/memory_usage.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize_job.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/precision.h"
#include "optimizer/validation/bisect.h"
#include "optimizer/validation/calibration.h"
#include "optimizer/validation/length_check.h"

namespace onnxopt {
namespace {

std::string CulpritList(const v1::Bisection& bisection) {
  std::vector<std::string> names;
  for (const auto& culprit : bisection.culprits()) {
    names.push_back(absl::StrCat(culprit.pass(), " (run ", culprit.position(), ", sweep ", culprit.iteration(), ")"));
  }
  return absl::StrJoin(names, ", then ");
}

// True if a pass run of `runs` counted `counter`.
bool CountedBy(const std::vector<v1::PassReport>& runs, const std::string& counter) {
  for (const auto& run : runs) {
    if (auto it = run.counters().find(counter); it != run.counters().end() && it->second > 0) return true;
  }
  return false;
}

// The graph input remove_padding packed the model by, when it changed the model; its result is
// judged on that mask's valid positions. The gather form reads it as NonZero(Reshape(mask, [-1])), the
// packed form as RemovePadding's token counts: ReduceSum(Cast(mask)) or the embedding's mask index
// (EmbedLayerNormalization's output 1, from its mask input 7).
std::string PaddingMaskInput(const std::vector<v1::PassReport>& runs, const onnx::ModelProto& model) {
  bool ran = false;
  for (const auto& run : runs) ran |= run.name() == "remove_padding" && run.rewrites() > 0;
  if (!ran) return "";
  std::unordered_map<std::string, const onnx::NodeProto*> producers;
  for (const auto& node : model.graph().node()) {
    for (const auto& output : node.output()) producers[output] = &node;
  }
  auto graph_input_behind = [&](std::string value) -> std::string {
    for (auto it = producers.find(value); it != producers.end(); it = producers.find(value)) {
      const onnx::NodeProto& node = *it->second;
      const bool passes_mask = node.op_type() == "Cast" || node.op_type() == "Reshape" || node.op_type() == "ReduceSum";
      if (passes_mask && node.input_size() >= 1) {
        value = node.input(0);
      } else if (node.op_type() == "EmbedLayerNormalization" && node.output_size() > 1 && node.output(1) == value &&
                 node.input_size() > 7) {
        value = node.input(7);
      } else {
        return "";
      }
    }
    for (const auto& input : model.graph().input()) {
      if (input.name() == value) return value;
    }
    return "";
  };
  for (const auto& node : model.graph().node()) {
    const bool gathered = node.op_type() == "NonZero" && node.input_size() >= 1;
    const bool packed = node.op_type() == "RemovePadding" && node.input_size() >= 2;
    if (!gathered && !packed) continue;
    const std::string mask = graph_input_behind(node.input(packed ? 1 : 0));
    if (!mask.empty()) return mask;
  }
  return "";
}

// The largest magnitude of every float32 value the main graph computes, on one input set.
absl::StatusOr<std::map<std::string, double>> MaxAbsActivations(const onnx::ModelProto& model,
                                                               const GeneratedInputs& inputs,
                                                               const SessionSettings& device) {
  std::vector<std::string> names;
  onnx::ModelProto copy = model;
  Graph graph(copy.mutable_graph());
  const std::unordered_map<std::string, int32_t> types = InferElementTypes(graph, nullptr);
  for (const Node* node : graph.Nodes()) {
    for (const auto& output : node->proto().output()) {
      auto type = types.find(output);
      if (!output.empty() && type != types.end() && type->second == onnx::TensorProto::FLOAT) names.push_back(output);
    }
  }
  absl::StatusOr<std::map<std::string, ValueRange>> ranges = CalibrateRanges(model, names, {&inputs}, "minmax", device);
  if (!ranges.ok()) return ranges.status();
  std::map<std::string, double> largest;
  for (const auto& [name, range] : *ranges) largest[name] = std::max(std::fabs(range.low), std::fabs(range.high));
  return largest;
}

// The original is what every candidate is judged against: where ONNX Runtime does not load it (an
// operator it has no kernel for, a type it refuses that the onnx checker let pass), the model is the
// user's to mend, so the job fails as a bad model with ONNX Runtime's words, and the report says why
// parity did not run instead of listing no outputs as a failure.
absl::Status OriginalDoesNotLoad(const absl::Status& status, v1::ParityReport* parity) {
  std::string why = absl::StrCat("the original model does not load in ONNX Runtime: ", TextOf(status));
  parity->set_not_run(why);
  return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_CHECK_FAILED, why);
}

}  // namespace

// Judges a candidate in memory (the bisection's probes) or, for the result, from its file. A candidate
// ONNX Runtime cannot load or run fails parity like one with wrong numbers, so that bisection can
// find the pass that made it and recover.
absl::StatusOr<bool> OptimizeJob::Judge(const onnx::ModelProto& model, const ModelSource& source,
                                        v1::ParityReport* into) {
  const std::string precision = ModelPrecision(model);
  auto broken = [&](absl::string_view what, const absl::Status& status) {
    into->clear_outputs();
    into->set_passed(false);
    v1::OutputParity* output = into->add_outputs();
    output->set_name("(model)");
    output->set_note(absl::StrCat(what, status.message()));
    return false;
  };
  SessionSettings settings = validation_.parity_settings;
  // A candidate that keeps most of a model larger than memory in float32 (the float32 fallback, a bisection's
  // probe) runs from its mapped files too; one that fits runs as it is deployed, weights prepacked.
  settings.prepack_weights = !ModelExceedsMemory(ModelBytes(model));
  auto session = CreateSession(source, settings);
  if (!session.ok()) return broken("the optimized model does not load in ONNX Runtime: ", session.status());
  absl::Status compared =
      CompareWithReference(**session, precision, *validation_.reference, config_.validation(), request_.run, into);
  if (compared.code() == absl::StatusCode::kInternal) return broken("", compared);
  if (!compared.ok()) return compared;
  const bool traced =
      validation_.greedy_reference.has_value() || (loaded_.exceeds_memory && validation_.cache.has_value());
  if (!into->passed() && traced && loaded_.original && (precision == "int8" || precision == "int4")) {
    if (absl::Status judged = JudgeByGeneration(**session, precision, into); !judged.ok()) return judged;
  }
  if (absl::Status judged = JudgePerplexity(**session, into); !judged.ok()) return judged;
  return into->passed();
}

absl::Status OptimizeJob::ScoreSuppliedTokens(Ort::Session& original) {
  const std::optional<CacheInterface> cache = FindCacheInterface(Original().graph());
  if (!cache || loaded_.supplied.empty()) return absl::OkStatus();
  bool has_ids = false;
  for (const auto& sample : loaded_.supplied) has_ids |= sample.count(cache->ids_input) > 0;
  if (!has_ids) return absl::OkStatus();
  Progress(Phase::kValidating, "the original's perplexity on the supplied tokens");
  absl::StatusOr<TokenLoss> loss = SuppliedTokenLoss(original, Original(), *cache, loaded_.supplied);
  if (absl::IsInvalidArgument(loss.status())) return loss.status();  // the user's ids: their error
  if (loss.ok()) {
    validation_.original_loss = *loss;
    validation_.scored_cache = cache;
  } else {
    validation_.loss_note = absl::StrCat("not scored: ", loss.status().message());
  }
  return absl::OkStatus();
}

absl::Status OptimizeJob::JudgePerplexity(Ort::Session& candidate, v1::ParityReport* into) {
  v1::PerplexityReport* perplexity = into->mutable_perplexity();
  perplexity->Clear();
  if (!validation_.original_loss) {
    if (validation_.loss_note.empty()) {
      into->clear_perplexity();
    } else {
      perplexity->set_note(validation_.loss_note);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<TokenLoss> loss =
      SuppliedTokenLoss(candidate, Original(), *validation_.scored_cache, loaded_.supplied);
  if (!loss.ok()) {
    perplexity->set_note(absl::StrCat("the result could not be scored: ", loss.status().message()));
    perplexity->set_passed(false);
    into->set_passed(false);
    return absl::OkStatus();
  }
  const double max_ratio = config_.validation().max_perplexity_ratio();
  perplexity->set_tokens(loss->tokens);
  perplexity->set_original(validation_.original_loss->Perplexity());
  perplexity->set_optimized(loss->Perplexity());
  perplexity->set_ratio(perplexity->original() > 0 ? perplexity->optimized() / perplexity->original() : 0);
  perplexity->set_max_ratio_allowed(max_ratio);
  perplexity->set_passed(max_ratio <= 0 || perplexity->ratio() <= max_ratio);
  perplexity->set_note(absl::StrFormat("perplexity %.4f -> %.4f (%.4fx) on %d supplied tokens%s", perplexity->original(),
                                       perplexity->optimized(), perplexity->ratio(), loss->tokens,
                                       max_ratio <= 0 ? ", reported only (validation.max_perplexity_ratio unset)"
                                       : perplexity->passed() ? absl::StrFormat(" <= %.4gx", max_ratio)
                                                              : absl::StrFormat(" > %.4gx: FAILED", max_ratio)));
  if (!perplexity->passed()) into->set_passed(false);
  return absl::OkStatus();
}

absl::Status OptimizeJob::TraceGreedyReference(Ort::Session& original) {
  const v1::PrecisionConfig& precision = config_.precision();
  const PrecisionMode mode = precision.mode();
  const bool quantizing = mode == v1::PrecisionConfig::int8_dynamic || mode == v1::PrecisionConfig::int8_static ||
                          mode == v1::PrecisionConfig::int4_weight_only || mode == v1::PrecisionConfig::auto_;
  const v1::ValidationConfig& validation = config_.validation();
  if (!rewritten_.precision_requested || !quantizing ||
      (validation.has_judge_generation() && !validation.judge_generation()) ||
      config_.benchmark().generation().skip()) {
    return absl::OkStatus();
  }
  validation_.cache = FindCacheInterface(Original().graph());
  if (!validation_.cache) return absl::OkStatus();
  absl::StatusOr<v1::GenerationConfig> resolved = ResolveGenerationConfig(config_.benchmark().generation());
  if (!resolved.ok()) return resolved.status();
  validation_.greedy_config = *resolved;
  if (loaded_.exceeds_memory) {
    v1::MemoryReport* memory = report_.mutable_memory();
    memory->set_original_from_disk(absl::StrCat(
        memory->original_from_disk(), "; its greedy generation (every weight read from the disk for each token) was "
        "not traced: a quantized result failing its prefill is judged on its own greedy picks, which the original "
        "scores in one pass"));
    return absl::OkStatus();
  }
  Progress(Phase::kValidating, "the original's greedy generation");
  absl::StatusOr<GreedyTrace> trace =
      TraceOriginalGreedy(original, Original(), *validation_.cache, validation_.greedy_config);
  // A model the generation loop cannot drive is judged on its outputs alone, as before.
  if (trace.ok()) validation_.greedy_reference = *std::move(trace);
  return absl::OkStatus();
}

absl::Status OptimizeJob::JudgeByGeneration(Ort::Session& candidate, const std::string& precision,
                                            v1::ParityReport* into) {
  v1::GenerationVerdict* verdict = into->mutable_generation();
  verdict->Clear();
  verdict->set_ran(true);
  const Tolerance tolerance = ToleranceFor(config_.validation(), validation_.cache->logits_output, precision);
  verdict->set_max_kl_allowed(tolerance.max_kl);
  verdict->set_min_cosine_allowed(tolerance.min_cosine);
  v1::GenerationReport greedy;
  absl::Status compared = absl::OkStatus();
  if (validation_.greedy_reference) {
    compared = CompareToGreedyTrace(candidate, Original(), *validation_.cache, validation_.greedy_config,
                                    *validation_.greedy_reference, &greedy);
  } else {
    // The original larger than memory: the candidate's own picks, scored by the original in one pass.
    absl::StatusOr<GreedyTrace> own =
        TraceOwnGreedy(candidate, Original(), *validation_.cache, validation_.greedy_config);
    absl::StatusOr<GreedyTrace> scored = absl::InternalError("not scored");
    if (own.ok()) {
      Progress(Phase::kValidating, "the original scoring the greedy generation (from the disk)");
      auto original = CreateSession(OriginalSource(), ForOriginal(validation_.reference_settings));
      scored = original.ok()
                   ? ScoreGreedyTrace(**original, Original(), *validation_.cache, validation_.greedy_config, *own)
                   : absl::StatusOr<GreedyTrace>(original.status());
    } else {
      scored = own.status();
    }
    if (scored.ok()) CompareGreedyTraces(*scored, *own, /*exact_tokens=*/false, &greedy);
    compared = scored.status();
  }
  if (!compared.ok()) {
    verdict->set_note(absl::StrCat("could not run: ", compared.message()));
    return absl::OkStatus();
  }
  verdict->set_steps(greedy.steps_size());
  verdict->set_mean_kl_divergence(greedy.mean_kl_divergence());
  verdict->set_max_kl_divergence(greedy.max_kl_divergence());
  verdict->set_min_logits_cosine(greedy.min_logits_cosine());
  verdict->set_top1_agreement(greedy.top1_agreement());
  const bool close = tolerance.max_kl > 0 && greedy.mean_kl_divergence() <= tolerance.max_kl;
  const bool aligned = greedy.min_logits_cosine() >= tolerance.min_cosine;
  verdict->set_passed(close && aligned);
  verdict->set_note(absl::StrFormat(
      "%d greedy steps teacher-forced on the %s picks: mean KL %.5f (%s %.4g), min logits cosine %.5f "
      "(%s %.4g), top-1 %.3f", greedy.steps_size(),
      validation_.greedy_reference ? "original's" : "candidate's own (the original scoring them in one pass)",
      greedy.mean_kl_divergence(), close ? "<=" : ">", tolerance.max_kl, greedy.min_logits_cosine(),
      aligned ? ">=" : "<", tolerance.min_cosine, greedy.top1_agreement()));
  if (verdict->passed()) into->set_passed(true);
  return absl::OkStatus();
}

absl::Status OptimizeJob::Validate() {
  if (config_.validation().skip()) return absl::OkStatus();
  Progress(Phase::kValidating);
  absl::StatusOr<SessionSettings> device = Device();
  if (!device.ok()) return device.status();
  // The reference is CPU fp32 arithmetic: the original on the CPU, ONNX Runtime's rewrites off. The
  // compared models run on the job's device (TF32 off on CUDA unless the job deploys with it).
  validation_.reference_settings = *device;
  validation_.reference_settings.device = v1::DEVICE_CPU;
  validation_.reference_settings.optimization_level = ORT_DISABLE_ALL;
  validation_.parity_settings = *device;
  validation_.parity_settings.optimization_level =
      OrtLevel(config_.validation().ort_optimization_level(), ORT_DISABLE_ALL);
  validation_.parity_settings.cuda_tf32 = config_.validation().allow_tf32();
  v1::ParityReport* parity = report_.mutable_parity();
  parity->set_ort_optimization_level(OrtLevelName(validation_.parity_settings.optimization_level));
  parity->set_reference(DescribeSettings(validation_.reference_settings));
  parity->set_device(DescribeSettings(validation_.parity_settings));
  parity->set_tf32(validation_.parity_settings.device == v1::DEVICE_CUDA && validation_.parity_settings.cuda_tf32);
  Progress(Phase::kValidating, "reference outputs");
  {
    // The original's session lives only while it computes the reference: the outputs are kept, and
    // every candidate judged later opens its own session without the original's beside it.
    const auto reference_start = std::chrono::steady_clock::now();
    auto original_session = CreateSession(OriginalSource(), ForOriginal(validation_.reference_settings));
    if (!original_session.ok()) return OriginalDoesNotLoad(original_session.status(), parity);
    absl::StatusOr<ParityReference> reference = BuildParityReference(
        **original_session, Original(), config_.validation(), loaded_.supplied, request_.run, parity);
    if (!reference.ok()) return reference.status();
    if (loaded_.exceeds_memory) {
      v1::MemoryReport* memory = report_.mutable_memory();
      memory->set_original_from_disk(absl::StrFormat(
          "%s; its reference outputs (%d input set(s)) took %.1f s, disk-bound", memory->original_from_disk(),
          reference->sets.size(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - reference_start).count()));
    }
    validation_.reference = *std::move(reference);
    if (absl::Status scored = ScoreSuppliedTokens(**original_session); !scored.ok()) return scored;
    if (absl::Status traced = TraceGreedyReference(**original_session); !traced.ok()) return traced;
  }
  if (absl::Status measured = MeasureDeviceNoise(); !measured.ok()) return measured;
  parity->set_noise_factor(NoiseFactor(config_.validation()));
  validation_.reference->valid_positions_of = PaddingMaskInput(rewritten_.pass_reports, rewritten_.optimized);
  parity->set_valid_positions_of(validation_.reference->valid_positions_of);
  validation_.reference->skip_rows_masked_entirely.reset();
  if (CountedBy(rewritten_.pass_reports, "rows_masked_entirely_differ")) {
    validation_.reference->skip_rows_masked_entirely = FindCacheInterface(Original().graph());
  }
  parity->set_rows_masked_entirely_skipped(validation_.reference->skip_rows_masked_entirely.has_value());
  const bool auto_precision = config_.precision().mode() == v1::PrecisionConfig::auto_;
  if (auto_precision) {
    if (absl::Status chosen = ChoosePrecision(); !chosen.ok()) return chosen;
  }
  absl::StatusOr<ModelSource> source = SourceOf(rewritten_.optimized, /*saved=*/true);
  if (!source.ok()) return source.status();
  Progress(Phase::kValidating, "comparing outputs");
  absl::StatusOr<bool> passed = Judge(rewritten_.optimized, *source, parity);
  if (!passed.ok()) return passed.status();
  if (!*passed && rewritten_.precision_requested && !auto_precision) {
    passed = RecoverPrecision(parity);
    if (!passed.ok()) return passed.status();
  }
  if (!*passed) {
    Progress(Phase::kValidating, "bisecting the passes that broke parity");
    if (absl::Status recovered = RecoverByBisection(parity); !recovered.ok()) return recovered;
  }
  return CheckFreedDims(parity);
}

// Where the compared models run otherwise than the reference, the original's own deviation there
// bounds how far a correct rewrite may stray (ValidationConfig.noise_factor).
absl::Status OptimizeJob::MeasureDeviceNoise() {
  if (SameArithmetic(validation_.parity_settings, validation_.reference_settings)) return absl::OkStatus();
  Progress(Phase::kValidating, "device noise");
  auto device_original = CreateSession(OriginalSource(), ForOriginal(validation_.parity_settings));
  if (!device_original.ok()) return device_original.status();
  return MeasureDeviceDeviation(**device_original, request_.run, &*validation_.reference);
}

absl::StatusOr<bool> OptimizeJob::RecoverPrecision(v1::ParityReport* parity) {
  const v1::PrecisionConfig& precision = config_.precision();
  const std::string mode = v1::PrecisionConfig::Mode_Name(precision.mode());
  v1::PrecisionReport* described = report_.mutable_precision();
  described->set_note(absl::StrCat("the ", mode, " model failed parity: ", WorstOutput(*parity)));
  ParityProbe probe = [&](const onnx::ModelProto& candidate, v1::ParityReport* into) -> absl::StatusOr<bool> {
    *into = *parity;
    absl::StatusOr<ModelSource> source = SourceOf(candidate, /*saved=*/false);
    if (!source.ok()) return source.status();
    return Judge(candidate, *source, into);
  };
  if (!precision.has_auto_mixed() || precision.auto_mixed()) {
    Progress(Phase::kValidating, "automatic mixed precision");
    ActivationMagnitudes magnitudes = [&](const onnx::ModelProto& model) {
      return MaxAbsActivations(model, validation_.reference->sets.front().inputs, validation_.parity_settings);
    };
    std::string search_failure;
    const v1::PrecisionReport measured = *described;  // int4: every projection's error, worst first
    absl::StatusOr<std::optional<MixedPrecisionResult>> mixed =
        SearchMixedPrecision(rewritten_.fp32_model, precision, rewritten_.calibrated, probe, magnitudes, PassOptions(),
                             &search_failure, WorstProjections(measured));
    if (!mixed.ok()) return mixed.status();
    if (mixed->has_value()) {
      MixedPrecisionResult& found = **mixed;
      rewritten_.optimized = std::move(found.model);
      rewritten_.precision_runs = std::move(found.runs);
      *parity = found.parity;
      report_.clear_passes();
      for (const auto& pass_report : AllRuns(rewritten_.precision_runs)) *report_.add_passes() = pass_report;
      const std::string first_failure = described->note();
      described->Clear();
      described->set_note(first_failure);
      DescribePrecision(precision, rewritten_.fp32_model, rewritten_.optimized, rewritten_.precision_runs, described);
      KeepProjectionsStillQuantized(measured, found.kept, described);
      described->clear_kept_nodes();
      for (const auto& kept : found.kept) *described->add_kept_nodes() = kept;
      described->set_auto_mixed_attempts(found.attempts);
      report_.add_warnings(absl::StrCat(mode, " alone failed parity; automatic mixed precision kept ",
                                        found.kept.size(), " node(s) in float32 (see precision.kept_nodes)"));
      if (absl::Status resaved = SaveResult(rewritten_.optimized, AllRuns(rewritten_.precision_runs)); !resaved.ok()) {
        return resaved;
      }
      return true;
    }
    described->set_note(
        absl::StrCat(described->note(), "; automatic mixed precision found nothing: ", search_failure));
  }
  if (config_.validation().on_parity_failure() == v1::ON_PARITY_FAILURE_FAIL) {
    return Failure(absl::StatusCode::kAborted, v1::ErrorReason::PARITY_FAILED,
                   absl::StrCat("precision mode '", mode, "' broke parity",
                                described->note().empty() ? "" : absl::StrCat(" (", described->note(), ")"),
                                "; see the report's parity and precision sections"));
  }
  // Recover: give the lower precision up, keep the float32 pipeline output if it passes.
  described->set_note(absl::StrCat(described->note().empty() ? "" : absl::StrCat(described->note(), "; "),
                                   mode, " broke parity, so the float32 model is returned"));
  report_.add_warnings(
      absl::StrCat("precision mode '", mode, "' broke parity; the returned model stays in float32"));
  rewritten_.optimized = rewritten_.fp32_model;
  rewritten_.interface_changed = false;
  rewritten_.precision_runs.clear();
  report_.clear_passes();
  for (const auto& pass_report : rewritten_.pass_reports) *report_.add_passes() = pass_report;
  if (absl::Status resaved = SaveResult(rewritten_.optimized, rewritten_.pass_reports); !resaved.ok()) return resaved;
  absl::StatusOr<ModelSource> fp32_source = SourceOf(rewritten_.optimized, /*saved=*/true);
  if (!fp32_source.ok()) return fp32_source.status();
  return Judge(rewritten_.optimized, *fp32_source, parity);
}

absl::Status OptimizeJob::RecoverByBisection(v1::ParityReport* parity) {
  ParityProbe probe = [&](const onnx::ModelProto& candidate, v1::ParityReport* into) -> absl::StatusOr<bool> {
    *into = *parity;
    absl::StatusOr<ModelSource> source = SourceOf(candidate, /*saved=*/false);
    if (!source.ok()) return source.status();
    return Judge(candidate, *source, into);
  };
  absl::StatusOr<BisectionResult> bisected = BisectAndRecover(Original(), *loaded_.pipeline, rewritten_.optimized,
                                                              rewritten_.pass_reports, probe, request_.run);
  if (!bisected.ok()) return bisected.status();
  const std::string culprits = CulpritList(bisected->bisection);
  if (config_.validation().on_parity_failure() == v1::ON_PARITY_FAILURE_FAIL) {
    *parity->mutable_bisection() = bisected->bisection;
    return Failure(absl::StatusCode::kAborted, v1::ErrorReason::PARITY_FAILED,
                   absl::StrCat("the optimized model's outputs differ from the original's beyond the tolerance",
                                culprits.empty() ? "" : absl::StrCat("; the first pass to break parity: ", culprits),
                                "; see the report's parity section"));
  }
  // Recover: the best model that passes becomes the result.
  *parity = bisected->parity;
  *parity->mutable_bisection() = bisected->bisection;
  validation_.returned_original = bisected->bisection.returned_original();
  report_.add_warnings(
      absl::StrCat("the full pipeline broke parity", culprits.empty() ? "" : absl::StrCat(" (", culprits, ")"),
                   validation_.returned_original ? "; the original model is returned"
                                                 : "; the returned model was optimized without the culprit passes"));
  rewritten_.optimized = std::move(bisected->model);
  report_.clear_passes();
  for (const auto& pass_report : bisected->passes) *report_.add_passes() = pass_report;
  return SaveResult(rewritten_.optimized, bisected->passes);
}

// Dims the pipeline freed: the result at other lengths, which parity at the exported shapes does not
// see (validation/length_check.h).
absl::Status OptimizeJob::CheckFreedDims(v1::ParityReport* parity) {
  if (validation_.returned_original || FreedDims(Original(), rewritten_.optimized).empty()) return absl::OkStatus();
  Progress(Phase::kValidating, "other lengths");
  absl::StatusOr<ModelSource> source = SourceOf(rewritten_.optimized, /*saved=*/true);
  if (!source.ok()) return source.status();
  // Both on the job's device, which the result may need (packed attention runs on CUDA only).
  auto original_session = CreateSession(OriginalSource(), ForOriginal(validation_.parity_settings));
  if (!original_session.ok()) return original_session.status();
  auto optimized_session = CreateSession(*source, validation_.parity_settings);
  if (!optimized_session.ok()) return optimized_session.status();
  absl::Status checked = CheckFreedLengths(**original_session, Original(), **optimized_session, rewritten_.optimized,
                                           ModelPrecision(rewritten_.optimized), config_.validation(), parity);
  if (!checked.ok()) return checked;
  for (const auto& check : parity->lengths()) {
    if (!check.passed()) {
      parity->set_passed(false);
      return Failure(absl::StatusCode::kAborted, v1::ErrorReason::PARITY_FAILED,
                     absl::StrCat("with '", check.dim(), "' at ", check.length(), " instead of the exported ",
                                  check.exported(), ": ", check.note()));
    }
    if (!check.note().empty()) {
      report_.add_warnings(absl::StrCat("'", check.dim(), "' at ", check.length(), ": ", check.note()));
    }
    if (check.length() < check.exported() && check.compared_outputs_size() == 0) {
      report_.add_warnings(absl::StrCat("'", check.dim(), "' at ", check.length(),
                                        ": no output could be compared with the original (their first positions "
                                        "depend on later ones); only the exported length was compared"));
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxopt
