#include "optimizer/validation/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "optimizer/failure.h"
#include "optimizer/tensor_convert.h"
#include "optimizer/validation/parity.h"

namespace onnxopt {
namespace {

// The greedy comparison's batch: one row padded on the left (a quarter of the prompt), one not.
constexpr int64_t kGreedyBatch = 2;
constexpr int kGenerationWarmupPairs = 2;
constexpr int kMinGenerationRuns = 3;

// Writes `values` into an integer, float or boolean tensor of as many elements.
absl::Status FillNumbers(Ort::Value& tensor, const std::vector<int64_t>& values, const std::string& name) {
  auto info = tensor.GetTensorTypeAndShapeInfo();
  if (info.GetElementCount() != values.size()) {
    return absl::InternalError(absl::StrCat("generation: ", name, " holds ", info.GetElementCount(), " elements, not ",
                                            values.size()));
  }
  switch (info.GetElementType()) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
      std::copy(values.begin(), values.end(), tensor.GetTensorMutableData<int64_t>());
      return absl::OkStatus();
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
      std::transform(values.begin(), values.end(), tensor.GetTensorMutableData<int32_t>(),
                     [](int64_t v) { return static_cast<int32_t>(v); });
      return absl::OkStatus();
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      std::transform(values.begin(), values.end(), tensor.GetTensorMutableData<float>(),
                     [](int64_t v) { return static_cast<float>(v); });
      return absl::OkStatus();
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
      std::transform(values.begin(), values.end(), tensor.GetTensorMutableData<bool>(),
                     [](int64_t v) { return v != 0; });
      return absl::OkStatus();
    default:
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::GENERATION_UNSUPPORTED,
                     absl::StrCat("input '", name, "' has an element type the generation check cannot fill"));
  }
}

// A tensor of `shape` with `values`, of the element type of `like` (the input's previous value).
absl::StatusOr<Ort::Value> NumberTensor(const Ort::Value& like, const std::vector<int64_t>& shape,
                                        const std::vector<int64_t>& values, const std::string& name) {
  const auto type = like.GetTensorTypeAndShapeInfo().GetElementType();
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value tensor = Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), type);
  if (absl::Status filled = FillNumbers(tensor, values, name); !filled.ok()) return filled;
  return tensor;
}

// Position ids as generation computes them from the mask: the count of kept positions before, 1 on
// padding (transformers' cumsum(mask) - 1, masked_fill(mask == 0, 1)); the last `new_tokens` of each row.
std::vector<int64_t> PositionsFromMask(const std::vector<std::vector<int64_t>>& mask, int64_t new_tokens) {
  std::vector<int64_t> positions;
  for (const auto& row : mask) {
    int64_t kept = 0;
    const int64_t total = static_cast<int64_t>(row.size());
    for (int64_t t = 0; t < total; ++t) {
      kept += row[static_cast<size_t>(t)] != 0;
      if (t >= total - new_tokens) positions.push_back(row[static_cast<size_t>(t)] != 0 ? kept - 1 : 1);
    }
  }
  return positions;
}

// The last position's logits of each row: [B, V] from [B, S, V] or [B, V].
absl::StatusOr<std::vector<std::vector<float>>> LastLogits(const Ort::Value& logits) {
  auto info = logits.GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> shape = info.GetShape();
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || (shape.size() != 3 && shape.size() != 2)) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::GENERATION_UNSUPPORTED,
                   "the logits are not float [B, S, V] or [B, V]");
  }
  const int64_t rows = shape[0], vocab = shape.back(), length = shape.size() == 3 ? shape[1] : 1;
  const float* data = logits.GetTensorData<float>();
  std::vector<std::vector<float>> last(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) {
    const float* row = data + (b * length + length - 1) * vocab;
    last[static_cast<size_t>(b)].assign(row, row + vocab);
  }
  return last;
}

int64_t ArgMax(const std::vector<float>& values) {
  return static_cast<int64_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? dot / std::sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

// Whether `session` takes logits_to_keep (the logits_to_keep pass's optional input).
bool TakesLogitsToKeep(Ort::Session& session) {
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session.GetOverridableInitializerCount(); ++i) {
    if (session.GetOverridableInitializerNameAllocated(i, allocator).get() == std::string(kLogitsToKeepInput)) {
      return true;
    }
  }
  return false;
}

// Adds logits_to_keep = 1 to `feed` where `session` takes it: a generation step reads the last
// position's logits alone, so that is what a generation loop asks of such a model.
void KeepLastLogitsWhereTaken(Ort::Session& session, GeneratedInputs* feed) {
  if (!TakesLogitsToKeep(session)) return;
  Ort::AllocatorWithDefaultOptions allocator;
  const int64_t shape[1] = {1};
  Ort::Value keep = Ort::Value::CreateTensor<int64_t>(allocator, shape, 1);
  *keep.GetTensorMutableData<int64_t>() = 1;
  feed->names.push_back(kLogitsToKeepInput);
  feed->values.push_back(std::move(keep));
}

// `shared` as `session` is fed it: the same tensors (views), plus logits_to_keep = 1 where the session
// takes it.
GeneratedInputs FeedFor(Ort::Session& session, const GeneratedInputs& shared) {
  GeneratedInputs feed = InputViews(shared);
  KeepLastLogitsWhereTaken(session, &feed);
  return feed;
}

// One model's side of the greedy generation: its feed for the next step.
struct Generator {
  Ort::Session* session;
  GeneratedInputs feed;
  std::vector<std::string> outputs;
};

// The next step's feed: `tokens` as the one new token per row, the mask and positions grown by it, and
// the presents of `results` as the past.
absl::Status Advance(Generator& generator, const CacheInterface& cache, std::vector<Ort::Value>& results,
                     const std::vector<int64_t>& tokens, const std::vector<std::vector<int64_t>>& mask) {
  const int64_t batch = static_cast<int64_t>(tokens.size());
  std::map<std::string, size_t> output_index;
  for (size_t i = 0; i < generator.outputs.size(); ++i) output_index[generator.outputs[i]] = i;
  for (size_t i = 0; i < generator.feed.names.size(); ++i) {
    const std::string& name = generator.feed.names[i];
    absl::StatusOr<Ort::Value> value = Ort::Value(nullptr);
    if (name == kLogitsToKeepInput) {
      continue;  // stays 1
    } else if (name == cache.use_cache_input) {
      const int64_t one[1] = {1};
      Ort::AllocatorWithDefaultOptions allocator;
      Ort::Value use_cache = Ort::Value::CreateTensor<bool>(allocator, one, 1);
      *use_cache.GetTensorMutableData<bool>() = true;  // every step after the first reads its past
      value = std::move(use_cache);
    } else if (name == cache.ids_input) {
      value = NumberTensor(generator.feed.values[i], {batch, 1}, tokens, name);
    } else if (name == cache.mask_input) {
      std::vector<int64_t> flat;
      for (const auto& row : mask) flat.insert(flat.end(), row.begin(), row.end());
      value = NumberTensor(generator.feed.values[i], {batch, static_cast<int64_t>(mask[0].size())}, flat, name);
    } else if (name == cache.position_input) {
      value = NumberTensor(generator.feed.values[i], {batch, 1}, PositionsFromMask(mask, 1), name);
    } else {
      const auto entry = std::find_if(cache.entries.begin(), cache.entries.end(),
                                      [&](const CacheInterface::Entry& e) { return e.past == name; });
      if (entry == cache.entries.end() || output_index.count(entry->present) == 0) {
        return Failure(
            absl::StatusCode::kInvalidArgument, v1::ErrorReason::GENERATION_UNSUPPORTED,
            absl::StrCat("input '", name, "' is neither tokens, mask, positions nor a past the check feeds"));
      }
      value = std::move(results[output_index[entry->present]]);
    }
    if (!value.ok()) return value.status();
    generator.feed.values[i] = *std::move(value);
  }
  return absl::OkStatus();
}

// What the phases are timed with.
struct PhaseTiming {
  Ort::Session& original;
  Ort::Session& optimized;
  const onnx::ModelProto& model;
  const CacheInterface& cache;
  int max_runs;
  TimingMode mode;
  const RunContext& run;
};

// One phase: `batch` rows of `new_tokens` after a past of `past`.
struct Phase {
  const char* name;
  int64_t batch, past, new_tokens;
};

// The report with the cache's past inputs and present outputs named.
v1::GenerationReport CacheDescribed(const CacheInterface& cache) {
  v1::GenerationReport report;
  for (const auto& entry : cache.entries) {
    report.add_past_inputs(entry.past);
    report.add_present_outputs(entry.present);
  }
  return report;
}

// A phase's report entry, its figures still unset.
v1::GenerationPhase PhaseNamed(const Phase& phase) {
  v1::GenerationPhase result;
  result.set_phase(phase.name);
  result.set_batch(static_cast<int32_t>(phase.batch));
  result.set_new_tokens(static_cast<int32_t>(phase.new_tokens));
  result.set_past(static_cast<int32_t>(phase.past));
  return result;
}

// A timed phase's figures from each model's latencies.
void DescribePhaseTimes(const std::vector<double>& original, const std::vector<double>& optimized,
                        const Phase& phase, v1::GenerationPhase* result) {
  *result->mutable_original() = Summarize(original);
  *result->mutable_optimized() = Summarize(optimized);
  const double original_ms = result->original().p50_ms(), optimized_ms = result->optimized().p50_ms();
  result->set_speedup(optimized_ms > 0 ? original_ms / optimized_ms : 0);
  result->set_original_ms_per_token(original_ms / static_cast<double>(phase.new_tokens));
  result->set_optimized_ms_per_token(optimized_ms / static_cast<double>(phase.new_tokens));
  const double tokens = static_cast<double>(phase.batch * phase.new_tokens);
  if (original_ms > 0) result->set_original_tokens_per_second(tokens * 1000.0 / original_ms);
  if (optimized_ms > 0) result->set_optimized_tokens_per_second(tokens * 1000.0 / optimized_ms);
}

// The phases timed: for every batch, a prefill and a decode step at each past length.
std::vector<Phase> PhasesOf(const v1::GenerationConfig& config) {
  std::vector<Phase> phases;
  for (int batch : config.batch_sizes()) {
    phases.push_back({"prefill", batch, 0, config.prefill_tokens()});
    for (int past : config.decode_past()) phases.push_back({"decode", batch, past, 1});
  }
  return phases;
}

// Times `phase` for both sessions on the same inputs, interleaved, for `budget_seconds` (at least
// kMinGenerationRuns pairs, at most timing.max_runs). CANCELLED on cancel; what keeps the phase from
// running (memory, a kernel's refusal) is the phase's error.
absl::StatusOr<v1::GenerationPhase> TimePhase(const PhaseTiming& timing, const Phase& phase, double budget_seconds) {
  v1::GenerationPhase result = PhaseNamed(phase);
  absl::StatusOr<GeneratedInputs> inputs =
      StepInputs(timing.original, timing.model, timing.cache, phase.batch, phase.past, phase.new_tokens, 0);
  if (!inputs.ok()) {
    result.set_error(std::string(inputs.status().message()));
    return result;
  }
  Ort::Session* sessions[2] = {&timing.original, &timing.optimized};
  const std::vector<std::string> outputs[2] = {OutputNames(timing.original), OutputNames(timing.optimized)};
  const GeneratedInputs feeds[2] = {FeedFor(timing.original, *inputs), FeedFor(timing.optimized, *inputs)};
  std::unique_ptr<BoundRun> bound[2];
  TimedRunner runners[2];
  for (int k = 0; k < 2; ++k) {
    absl::StatusOr<TimedRunner> runner = RunnerFor(*sessions[k], feeds[k], outputs[k], timing.mode, &bound[k]);
    if (!runner.ok()) {
      result.set_error(std::string(runner.status().message()));
      return result;
    }
    runners[k] = *std::move(runner);
  }
  absl::StatusOr<std::array<std::vector<double>, 2>> latencies =
      TimeInTurns(runners, kGenerationWarmupPairs, std::min(kMinGenerationRuns, timing.max_runs), budget_seconds,
                  timing.run, timing.max_runs);
  if (absl::IsCancelled(latencies.status())) return latencies.status();
  if (!latencies.ok()) {
    result.set_error(std::string(latencies.status().message()));
    return result;
  }
  DescribePhaseTimes((*latencies)[0], (*latencies)[1], phase, &result);
  return result;
}

// One model's window of `phase`: `warmup` untimed steps, then timed ones (TimeWindow). Whatever keeps
// the phase from running (inputs, memory, a kernel's refusal) is the error returned.
absl::StatusOr<std::vector<double>> TimePhaseWindow(Ort::Session& session, const onnx::ModelProto& model,
                                                    const CacheInterface& cache, const Phase& phase,
                                                    const std::vector<std::string>& outputs, const TimingMode& mode,
                                                    int warmup, int min_runs, int max_runs, double seconds,
                                                    const RunContext& run) {
  absl::StatusOr<GeneratedInputs> inputs =
      StepInputs(session, model, cache, phase.batch, phase.past, phase.new_tokens, 0);
  if (!inputs.ok()) return inputs.status();
  KeepLastLogitsWhereTaken(session, &*inputs);
  std::unique_ptr<BoundRun> bound;
  absl::StatusOr<TimedRunner> runner = RunnerFor(session, *inputs, outputs, mode, &bound);
  if (!runner.ok()) return runner.status();
  return TimeWindow(*runner, warmup, min_runs, max_runs, seconds, run);
}

}  // namespace

absl::StatusOr<v1::GenerationConfig> ResolveGenerationConfig(const v1::GenerationConfig& config) {
  v1::GenerationConfig resolved = config;
  if (resolved.batch_sizes().empty()) {
    for (int batch : {1, 4}) resolved.add_batch_sizes(batch);
  }
  if (resolved.decode_past().empty()) {
    for (int past : {128, 512, 2048}) resolved.add_decode_past(past);
  }
  if (resolved.prefill_tokens() == 0) resolved.set_prefill_tokens(kDefaultPrefillTokens);
  if (resolved.greedy_tokens() == 0) resolved.set_greedy_tokens(kDefaultGreedyTokens);
  if (resolved.prompt_tokens() == 0) resolved.set_prompt_tokens(kDefaultPromptTokens);
  if (resolved.runs() == 0) resolved.set_runs(kDefaultGenerationRuns);
  auto in_range = [](int64_t v, int64_t low, int64_t high) { return v >= low && v <= high; };
  for (int batch : resolved.batch_sizes()) {
    if (!in_range(batch, 1, 256)) return absl::InvalidArgumentError("generation.batch_sizes must be in [1, 256]");
  }
  for (int past : resolved.decode_past()) {
    if (!in_range(past, 0, 1 << 20)) return absl::InvalidArgumentError("generation.decode_past must be in [0, 1048576]");
  }
  if (!in_range(resolved.prefill_tokens(), 1, 1 << 16) || !in_range(resolved.greedy_tokens(), 1, 4096) ||
      !in_range(resolved.prompt_tokens(), 1, 1 << 16) || !in_range(resolved.runs(), 1, 10000)) {
    return absl::InvalidArgumentError(
        "generation: prefill_tokens (1-65536), greedy_tokens (1-4096), prompt_tokens (1-65536) and runs (1-10000) "
        "must be positive and within their bounds");
  }
  return resolved;
}

absl::StatusOr<GeneratedInputs> StepInputs(Ort::Session& session, const onnx::ModelProto& model,
                                           const CacheInterface& cache, int64_t batch, int64_t past,
                                           int64_t new_tokens, int sample) {
  v1::ValidationConfig config;
  config.set_mask_padding(0);
  DimValues dims;
  if (!cache.batch_dim.empty()) dims[cache.batch_dim] = batch;
  dims[cache.past_dim] = past;
  dims[cache.new_dim] = new_tokens;  // GenerateInputs derives the total from these
  return GenerateInputs(session, model, config, dims, sample);
}

namespace {

// Runs `session` greedily from the comparison's prompt. Each step continues with the tokens `forced`
// picked at that step (the original's), or with its own picks where `forced` is null.
absl::StatusOr<GreedyTrace> TraceGreedy(Ort::Session& session, const onnx::ModelProto& model,
                                        const CacheInterface& cache, const v1::GenerationConfig& config,
                                        const GreedyTrace* forced, const char* which) {
  const int64_t prompt = config.prompt_tokens();
  // The prompt: row 0 whole, row 1 padded on the left by a quarter (at least one position kept).
  std::vector<std::vector<int64_t>> mask(kGreedyBatch, std::vector<int64_t>(static_cast<size_t>(prompt), 1));
  const int64_t padded = std::min(prompt - 1, prompt / 4);
  std::fill(mask[1].begin(), mask[1].begin() + padded, 0);
  Generator generator{&session, {}, OutputNames(session)};
  absl::StatusOr<GeneratedInputs> feed = StepInputs(session, model, cache, kGreedyBatch, 0, prompt, 0);
  if (!feed.ok()) return feed.status();
  generator.feed = *std::move(feed);
  KeepLastLogitsWhereTaken(session, &generator.feed);
  for (size_t i = 0; i < generator.feed.names.size(); ++i) {
    const std::string& name = generator.feed.names[i];
    std::vector<int64_t> values;
    if (name == cache.mask_input) {
      for (const auto& row : mask) values.insert(values.end(), row.begin(), row.end());
    } else if (name == cache.position_input) {
      values = PositionsFromMask(mask, prompt);
    } else {
      continue;
    }
    if (absl::Status filled = FillNumbers(generator.feed.values[i], values, name); !filled.ok()) return filled;
  }
  const auto logits_at = std::find(generator.outputs.begin(), generator.outputs.end(), cache.logits_output);
  GreedyTrace trace;
  trace.prompt_mask = mask;
  for (size_t i = 0; i < generator.feed.names.size(); ++i) {
    if (generator.feed.names[i] != cache.ids_input) continue;
    const Ort::Value& ids = generator.feed.values[i];
    const auto type = ids.GetTensorTypeAndShapeInfo().GetElementType();
    const size_t count = ids.GetTensorTypeAndShapeInfo().GetElementCount();
    if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
      trace.prompt_ids.assign(ids.GetTensorData<int64_t>(), ids.GetTensorData<int64_t>() + count);
    } else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) {
      trace.prompt_ids.assign(ids.GetTensorData<int32_t>(), ids.GetTensorData<int32_t>() + count);
    }
  }
  for (int step = 0; step < config.greedy_tokens(); ++step) {
    absl::StatusOr<std::vector<Ort::Value>> ran = RunOnInputs(session, generator.feed, generator.outputs);
    if (!ran.ok()) {
      return absl::InternalError(
          absl::StrCat("generation: the ", which, " model fails at step ", step, ": ", ran.status().message()));
    }
    absl::StatusOr<std::vector<std::vector<float>>> last =
        LastLogits((*ran)[static_cast<size_t>(logits_at - generator.outputs.begin())]);
    if (!last.ok()) return last.status();
    trace.logits.push_back(*std::move(last));
    if (step + 1 == config.greedy_tokens()) break;
    // Every model continues with the original's picks (`forced`), so each step compares the same context.
    const auto& picked_from = forced != nullptr ? forced->logits[static_cast<size_t>(step)] : trace.logits.back();
    std::vector<int64_t> tokens;
    for (const auto& row : picked_from) tokens.push_back(ArgMax(row));
    for (auto& row : mask) row.push_back(1);
    if (absl::Status advanced = Advance(generator, cache, *ran, tokens, mask); !advanced.ok()) return advanced;
  }
  return trace;
}

}  // namespace

// The greedy fields of `report` from both traces, token by token.
void CompareGreedyTraces(const GreedyTrace& original, const GreedyTrace& optimized, bool exact_tokens,
                         v1::GenerationReport* report) {
  int identical = 0, agreeing = 0;
  bool diverged = false;
  double min_cosine = 1.0, kl_sum = 0.0;
  for (size_t step = 0; step < original.logits.size() && step < optimized.logits.size(); ++step) {
    const auto& rows = original.logits[step];
    const auto& optimized_rows = optimized.logits[step];
    v1::GenerationStep* record = report->add_steps();
    double cosine = 1.0, kl = 0.0;
    bool agree = true;
    for (size_t b = 0; b < rows.size() && b < optimized_rows.size(); ++b) {
      const int64_t picked = ArgMax(rows[b]), optimized_pick = ArgMax(optimized_rows[b]);
      record->add_original_tokens(picked);
      record->add_optimized_tokens(optimized_pick);
      agree &= picked == optimized_pick;
      cosine = std::min(cosine, Cosine(rows[b], optimized_rows[b]));
      kl = std::max(kl, LogitsKlDivergence(rows[b], optimized_rows[b]));
    }
    record->set_logits_cosine(cosine);
    record->set_kl_divergence(kl);
    kl_sum += kl;
    report->set_max_kl_divergence(std::max(report->max_kl_divergence(), kl));
    record->set_top1_agree(agree);
    min_cosine = std::min(min_cosine, cosine);
    agreeing += agree;
    diverged |= !agree;
    identical += diverged ? 0 : 1;
  }
  report->set_identical_steps(identical);
  report->set_min_logits_cosine(min_cosine);
  report->set_top1_agreement(static_cast<double>(agreeing) / std::max(1, report->steps_size()));
  report->set_mean_kl_divergence(kl_sum / std::max(1, report->steps_size()));
  const bool passed = exact_tokens ? identical == report->steps_size() : min_cosine >= kMinLowerPrecisionCosine;
  report->set_passed(passed);
  if (!passed) {
    report->set_note(exact_tokens ? absl::StrFormat("the optimized model picks another token at step %d", identical)
                                  : absl::StrFormat("logits cosine %.4f below %.2f", min_cosine,
                                                    kMinLowerPrecisionCosine));
  }
}

absl::StatusOr<GreedyTrace> TraceOriginalGreedy(Ort::Session& original, const onnx::ModelProto& original_model,
                                                const CacheInterface& cache, const v1::GenerationConfig& config) {
  return TraceGreedy(original, original_model, cache, config, nullptr, "original");
}

absl::StatusOr<GreedyTrace> TraceOwnGreedy(Ort::Session& session, const onnx::ModelProto& original_model,
                                           const CacheInterface& cache, const v1::GenerationConfig& config) {
  return TraceGreedy(session, original_model, cache, config, nullptr, "optimized");
}

namespace {

// `session`'s logits for `ids` ([rows * length], row by row) read in one pass without a past, `mask`
// ([row][position]) as the attention mask and the positions counted from it: [rows, length, vocabulary].
// FAILED_PRECONDITION (GENERATION_UNSUPPORTED) where the logits do not cover every position.
absl::StatusOr<Ort::Value> WholeSequenceLogits(Ort::Session& session, const onnx::ModelProto& original_model,
                                               const CacheInterface& cache, const std::vector<int64_t>& ids,
                                               const std::vector<std::vector<int64_t>>& mask) {
  const int64_t rows = static_cast<int64_t>(mask.size());
  const int64_t length = rows > 0 ? static_cast<int64_t>(mask[0].size()) : 0;
  absl::StatusOr<GeneratedInputs> feed = StepInputs(session, original_model, cache, rows, 0, length, 0);
  if (!feed.ok()) return feed.status();
  for (size_t i = 0; i < feed->names.size(); ++i) {
    const std::string& name = feed->names[i];
    std::vector<int64_t> values;
    if (name == cache.ids_input) {
      values = ids;
    } else if (name == cache.mask_input) {
      for (const auto& row : mask) values.insert(values.end(), row.begin(), row.end());
    } else if (name == cache.position_input) {
      values = PositionsFromMask(mask, length);
    } else {
      continue;
    }
    if (absl::Status filled = FillNumbers(feed->values[i], values, name); !filled.ok()) return filled;
  }
  absl::StatusOr<std::vector<Ort::Value>> ran = RunOnInputs(session, *feed, {cache.logits_output});
  if (!ran.ok()) {
    return absl::InternalError(absl::StrCat("generation: the model fails on a whole sequence: ", ran.status().message()));
  }
  const auto info = (*ran)[0].GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> shape = info.GetShape();
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || shape.size() != 3 || shape[0] != rows ||
      shape[1] != length) {
    return Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::GENERATION_UNSUPPORTED,
                   "the logits do not cover every position ([batch, sequence, vocabulary]), so one "
                   "pass cannot score a sequence");
  }
  return std::move((*ran)[0]);
}

}  // namespace

absl::StatusOr<GreedyTrace> ScoreGreedyTrace(Ort::Session& scorer, const onnx::ModelProto& original_model,
                                             const CacheInterface& cache, const v1::GenerationConfig& config,
                                             const GreedyTrace& picks) {
  const int64_t prompt = config.prompt_tokens();
  const int64_t steps = static_cast<int64_t>(picks.logits.size());
  if (steps == 0 || picks.prompt_ids.size() != static_cast<size_t>(kGreedyBatch * prompt)) {
    return absl::InternalError("generation: the trace to score has no steps or no prompt");
  }
  // The prompt and every pick but the last, as one sequence without a past.
  const int64_t total = prompt + steps - 1;
  std::vector<std::vector<int64_t>> mask = picks.prompt_mask;
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < kGreedyBatch; ++b) {
    ids.insert(ids.end(), picks.prompt_ids.begin() + b * prompt, picks.prompt_ids.begin() + (b + 1) * prompt);
    for (int64_t step = 0; step + 1 < steps; ++step) {
      ids.push_back(ArgMax(picks.logits[static_cast<size_t>(step)][static_cast<size_t>(b)]));
      mask[static_cast<size_t>(b)].push_back(1);
    }
  }
  absl::StatusOr<Ort::Value> logits = WholeSequenceLogits(scorer, original_model, cache, ids, mask);
  if (!logits.ok()) return logits.status();
  const int64_t vocab = logits->GetTensorTypeAndShapeInfo().GetShape()[2];
  const float* data = logits->GetTensorData<float>();
  GreedyTrace scored;
  scored.prompt_ids = picks.prompt_ids;
  scored.prompt_mask = picks.prompt_mask;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> rows(kGreedyBatch);
    for (int64_t b = 0; b < kGreedyBatch; ++b) {
      const float* row = data + (b * total + prompt - 1 + step) * vocab;
      rows[static_cast<size_t>(b)].assign(row, row + vocab);
    }
    scored.logits.push_back(std::move(rows));
  }
  return scored;
}

double TokenLoss::Perplexity() const { return tokens > 0 ? std::exp(nll / static_cast<double>(tokens)) : 0.0; }

absl::StatusOr<TokenLoss> SuppliedTokenLoss(Ort::Session& session, const onnx::ModelProto& original_model,
                                            const CacheInterface& cache, const std::vector<SuppliedSample>& samples) {
  // A supplied tensor's values as integers.
  auto integers = [](const onnx::TensorProto& tensor, const std::string& name) -> absl::StatusOr<std::vector<int64_t>> {
    absl::StatusOr<Ort::Value> value = TensorProtoToOrtValue(tensor);
    if (!value.ok()) return value.status();
    const auto info = value->GetTensorTypeAndShapeInfo();
    const size_t count = info.GetElementCount();
    switch (info.GetElementType()) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
        return std::vector<int64_t>(value->GetTensorData<int64_t>(), value->GetTensorData<int64_t>() + count);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
        return std::vector<int64_t>(value->GetTensorData<int32_t>(), value->GetTensorData<int32_t>() + count);
      default:
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_INVALID,
                       absl::StrCat("supplied '", name, "' is not an integer tensor"));
    }
  };
  TokenLoss loss;
  bool any = false;
  for (const SuppliedSample& sample : samples) {
    const auto ids_tensor = sample.find(cache.ids_input);
    if (ids_tensor == sample.end()) continue;
    any = true;
    const auto& dims = ids_tensor->second.dims();
    if (dims.size() != 2 || dims[0] < 1 || dims[1] < 2) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_INVALID,
                     absl::StrCat("supplied '", cache.ids_input, "' must be [batch, sequence] with at least 2 tokens"));
    }
    const int64_t batch = dims[0], length = dims[1];
    absl::StatusOr<std::vector<int64_t>> ids = integers(ids_tensor->second, cache.ids_input);
    if (!ids.ok()) return ids.status();
    std::vector<std::vector<int64_t>> mask(static_cast<size_t>(batch), std::vector<int64_t>(static_cast<size_t>(length), 1));
    if (const auto given = sample.find(cache.mask_input); !cache.mask_input.empty() && given != sample.end()) {
      absl::StatusOr<std::vector<int64_t>> flat = integers(given->second, cache.mask_input);
      if (!flat.ok()) return flat.status();
      if (static_cast<int64_t>(flat->size()) != batch * length) {
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_INVALID,
                       absl::StrCat("supplied '", cache.mask_input, "' must be as long as the token ids (no past)"));
      }
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t t = 0; t < length; ++t) mask[b][t] = (*flat)[static_cast<size_t>(b * length + t)] != 0;
      }
    }
    absl::StatusOr<Ort::Value> scored = WholeSequenceLogits(session, original_model, cache, *ids, mask);
    if (!scored.ok()) return scored.status();
    const int64_t vocab = scored->GetTensorTypeAndShapeInfo().GetShape()[2];
    const float* logits = scored->GetTensorData<float>();
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t + 1 < length; ++t) {
        if (mask[b][t] == 0 || mask[b][t + 1] == 0) continue;
        const int64_t next = (*ids)[static_cast<size_t>(b * length + t + 1)];
        if (next < 0 || next >= vocab) {
          return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_INVALID,
                         absl::StrCat("supplied token id ", next, " is outside the vocabulary of ", vocab));
        }
        const float* row = logits + (b * length + t) * vocab;
        const double top = *std::max_element(row, row + vocab);
        double sum = 0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
        loss.nll += top + std::log(sum) - static_cast<double>(row[next]);
        ++loss.tokens;
      }
    }
  }
  if (!any) {
    return Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::GENERATION_UNSUPPORTED,
                   absl::StrCat("no supplied input set holds the token ids '", cache.ids_input, "'"));
  }
  return loss;
}

absl::Status CompareToGreedyTrace(Ort::Session& candidate, const onnx::ModelProto& original_model,
                                  const CacheInterface& cache, const v1::GenerationConfig& config,
                                  const GreedyTrace& reference, v1::GenerationReport* report) {
  absl::StatusOr<GreedyTrace> traced = TraceGreedy(candidate, original_model, cache, config, &reference, "optimized");
  if (!traced.ok()) return traced.status();
  CompareGreedyTraces(reference, *traced, /*exact_tokens=*/false, report);
  return absl::OkStatus();
}

absl::Status CompareGreedyGeneration(Ort::Session& original, Ort::Session& optimized,
                                     const onnx::ModelProto& original_model, const CacheInterface& cache,
                                     const v1::GenerationConfig& config, bool exact_tokens,
                                     v1::GenerationReport* report) {
  report->set_greedy_batch(static_cast<int32_t>(kGreedyBatch));
  report->set_prompt_tokens(config.prompt_tokens());
  absl::StatusOr<GreedyTrace> reference = TraceGreedy(original, original_model, cache, config, nullptr, "original");
  if (!reference.ok()) return reference.status();
  absl::StatusOr<GreedyTrace> traced = TraceGreedy(optimized, original_model, cache, config, &*reference, "optimized");
  if (!traced.ok()) return traced.status();
  CompareGreedyTraces(*reference, *traced, exact_tokens, report);
  return absl::OkStatus();
}

absl::StatusOr<v1::GenerationReport> BenchmarkGeneration(Ort::Session& original, Ort::Session& optimized,
                                                         const onnx::ModelProto& original_model,
                                                         const CacheInterface& cache,
                                                         const v1::GenerationConfig& config, bool exact_tokens,
                                                         double budget_seconds, const TimingMode& mode,
                                                         const RunContext& run) {
  v1::GenerationReport report = CacheDescribed(cache);
  const std::vector<Phase> phases = PhasesOf(config);
  const PhaseTiming timing{original, optimized, original_model, cache, config.runs(), mode, run};
  report.set_optimized_keeps_last_logits(TakesLogitsToKeep(optimized));
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < phases.size(); ++i) {
    // Each phase gets an equal share of what is left of the budget.
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double share = std::max(0.0, budget_seconds - elapsed) / static_cast<double>(phases.size() - i);
    absl::StatusOr<v1::GenerationPhase> timed = TimePhase(timing, phases[i], share);
    if (!timed.ok()) return timed.status();
    *report.add_phases() = *std::move(timed);
  }
  if (absl::Status greedy =
          CompareGreedyGeneration(original, optimized, original_model, cache, config, exact_tokens, &report);
      !greedy.ok()) {
    report.set_passed(false);
    report.set_note(std::string(greedy.message()));
  }
  return report;
}

absl::StatusOr<v1::GenerationReport> TimeGenerationAlone(Ort::Session& optimized,
                                                         const onnx::ModelProto& original_model,
                                                         const CacheInterface& cache,
                                                         const v1::GenerationConfig& config, bool exact_tokens,
                                                         double budget_seconds, const TimingMode& mode,
                                                         const RunContext& run, const OriginalOpener& open_original) {
  v1::GenerationReport report = CacheDescribed(cache);
  const std::vector<Phase> phases = PhasesOf(config);
  report.set_optimized_keeps_last_logits(TakesLogitsToKeep(optimized));
  const std::vector<std::string> outputs = OutputNames(optimized);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& phase = phases[i];
    v1::GenerationPhase* result = report.add_phases();
    *result = PhaseNamed(phase);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double share = std::max(0.0, budget_seconds - elapsed) / static_cast<double>(phases.size() - i);
    absl::StatusOr<std::vector<double>> timed =
        TimePhaseWindow(optimized, original_model, cache, phase, outputs, mode, kGenerationWarmupPairs,
                        std::min(kMinGenerationRuns, config.runs()), config.runs(), share, run);
    if (absl::IsCancelled(timed.status())) return timed.status();
    if (!timed.ok()) {
      result->set_error(std::string(timed.status().message()));
      continue;
    }
    DescribePhaseTimes({}, *timed, phase, result);
  }
  report.set_greedy_batch(static_cast<int32_t>(kGreedyBatch));
  report.set_prompt_tokens(config.prompt_tokens());
  absl::StatusOr<GreedyTrace> own = TraceOwnGreedy(optimized, original_model, cache, config);
  absl::StatusOr<GreedyTrace> scored = absl::InternalError("not scored");
  if (own.ok()) {
    absl::StatusOr<std::unique_ptr<Ort::Session>> original = open_original();
    scored = original.ok() ? ScoreGreedyTrace(**original, original_model, cache, config, *own)
                           : absl::StatusOr<GreedyTrace>(original.status());
  } else {
    scored = own.status();
  }
  if (!scored.ok()) {
    report.set_passed(false);
    report.set_note(absl::StrCat("not compared with the original's: ", scored.status().message()));
    return report;
  }
  CompareGreedyTraces(*scored, *own, exact_tokens, &report);
  report.set_note(absl::StrCat("teacher-forced on the optimized model's picks, the original scoring them in one pass",
                               report.note().empty() ? "" : "; ", report.note()));
  return report;
}

absl::StatusOr<v1::GenerationReport> BenchmarkGenerationAlternating(
    const ModelSource& original, const ModelSource& optimized, const SessionSettings& settings,
    const onnx::ModelProto& original_model, const CacheInterface& cache, const v1::GenerationConfig& config,
    bool exact_tokens, double budget_seconds, const TimingMode& mode, const RunContext& run) {
  v1::GenerationReport report = CacheDescribed(cache);
  const std::vector<Phase> phases = PhasesOf(config);
  const int rounds = kAlternatingRounds;
  const double per_phase = budget_seconds / (2.0 * rounds) / static_cast<double>(std::max<size_t>(1, phases.size()));
  // A phase's runs spread over the rounds: the side-by-side minimum and maximum in all, one warm-up a
  // window (a big model's prefill can take seconds a run).
  const int max_runs = std::max(1, (config.runs() + rounds - 1) / rounds);
  const int min_runs = std::min(max_runs, (kMinGenerationRuns + rounds - 1) / rounds);
  std::vector<std::array<std::vector<double>, 2>> latencies(phases.size());
  std::vector<std::string> errors(phases.size());
  std::optional<GreedyTrace> greedy[2];
  absl::Status greedy_failure = absl::OkStatus();
  const SessionWindow window = [&](Ort::Session& session, int which, int round) -> absl::Status {
    const std::vector<std::string> outputs = OutputNames(session);
    if (which == 1 && round == 0) report.set_optimized_keeps_last_logits(TakesLogitsToKeep(session));
    for (size_t i = 0; i < phases.size(); ++i) {
      if (!errors[i].empty()) continue;
      const Phase& phase = phases[i];
      // What keeps a phase from running (memory, a kernel's refusal) is the phase's error, as side by side.
      absl::StatusOr<std::vector<double>> timed = TimePhaseWindow(session, original_model, cache, phase, outputs, mode,
                                                                  /*warmup=*/1, min_runs, max_runs, per_phase, run);
      if (absl::IsCancelled(timed.status())) return timed.status();
      if (!timed.ok()) {
        errors[i] = std::string(timed.status().message());
        continue;
      }
      latencies[i][which].insert(latencies[i][which].end(), timed->begin(), timed->end());
    }
    // The greedy check once: the original first (round 0 opens it first), the result then replays its picks.
    if (round == 0 && greedy_failure.ok()) {
      absl::StatusOr<GreedyTrace> trace = TraceGreedy(session, original_model, cache, config,
                                                      which == 0 ? nullptr : &*greedy[0], which == 0 ? "original" : "optimized");
      if (trace.ok()) {
        greedy[which] = *std::move(trace);
      } else {
        greedy_failure = trace.status();
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status ran = InAlternatingSessions(original, optimized, settings, rounds, window, run); !ran.ok()) {
    return ran;
  }
  for (size_t i = 0; i < phases.size(); ++i) {
    v1::GenerationPhase* result = report.add_phases();
    *result = PhaseNamed(phases[i]);
    if (!errors[i].empty()) {
      result->set_error(errors[i]);
    } else {
      DescribePhaseTimes(latencies[i][0], latencies[i][1], phases[i], result);
    }
  }
  report.set_greedy_batch(static_cast<int32_t>(kGreedyBatch));
  report.set_prompt_tokens(config.prompt_tokens());
  if (greedy_failure.ok()) {
    CompareGreedyTraces(*greedy[0], *greedy[1], exact_tokens, &report);
  } else {
    report.set_passed(false);
    report.set_note(std::string(greedy_failure.message()));
  }
  return report;
}

namespace {

// ReportGeneration's frame: whether the model has a cache and the check runs, the resolved config,
// and the warning where the greedy check fails; `run` times and compares.
using GenerationRun = std::function<absl::StatusOr<v1::GenerationReport>(const CacheInterface&,
                                                                         const v1::GenerationConfig&)>;
absl::Status ReportGenerationWith(const onnx::ModelProto& original_model, const v1::BenchmarkConfig& config,
                                  const GenerationRun& run, v1::Report* report) {
  const std::optional<CacheInterface> cache = FindCacheInterface(original_model.graph());
  if (!cache || config.generation().skip()) return absl::OkStatus();
  absl::StatusOr<v1::GenerationConfig> resolved = ResolveGenerationConfig(config.generation());
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<v1::GenerationReport> generation = run(*cache, *resolved);
  if (!generation.ok()) return generation.status();
  *report->mutable_generation() = *std::move(generation);
  if (!report->generation().passed()) {
    report->add_warnings(absl::StrCat("greedy generation: ", report->generation().note()));
  }
  return absl::OkStatus();
}

}  // namespace

bool ExactTokensFor(const onnx::ModelProto& result) { return ModelPrecision(result) == "fp32"; }

absl::Status ReportGeneration(Ort::Session& original, Ort::Session& optimized, const GenerationCheck& check,
                              const RunContext& run, v1::Report* report) {
  return ReportGenerationWith(
      check.original_model, check.config,
      [&](const CacheInterface& cache, const v1::GenerationConfig& resolved) {
        return BenchmarkGeneration(original, optimized, check.original_model, cache, resolved, check.exact_tokens,
                                   TimeBudget(check.config), check.mode, run);
      },
      report);
}

absl::Status ReportGenerationOfResult(Ort::Session& optimized, const OriginalOpener& open_original,
                                      const GenerationCheck& check, const RunContext& run, v1::Report* report) {
  return ReportGenerationWith(
      check.original_model, check.config,
      [&](const CacheInterface& cache, const v1::GenerationConfig& resolved) {
        return TimeGenerationAlone(optimized, check.original_model, cache, resolved, check.exact_tokens,
                                   TimeBudget(check.config), check.mode, run, open_original);
      },
      report);
}

absl::Status ReportGenerationAlternating(const ModelSource& original, const ModelSource& optimized,
                                         const SessionSettings& settings, const GenerationCheck& check,
                                         const RunContext& run, v1::Report* report) {
  return ReportGenerationWith(
      check.original_model, check.config,
      [&](const CacheInterface& cache, const v1::GenerationConfig& resolved) {
        return BenchmarkGenerationAlternating(original, optimized, settings, check.original_model, cache, resolved,
                                              check.exact_tokens, TimeBudget(check.config), check.mode, run);
      },
      report);
}

}  // namespace onnxopt
