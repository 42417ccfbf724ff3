#include "optimizer/optimize.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "onnx/checker.h"
#include "optimizer/cache_interface.h"
#include "optimizer/contrib_schemas.h"
#include "optimizer/failure.h"
#include "optimizer/graph.h"
#include "optimizer/load_normalization.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/memory_usage.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize_job.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/precision.h"
#include "optimizer/result_files.h"
#include "optimizer/runtime_requirements.h"
#include "optimizer/runtime_source.h"
#include "optimizer/shape_inference.h"
#include "optimizer/transformer_report.h"
#include "optimizer/utf8.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/bisect.h"
#include "optimizer/validation/calibration.h"
#include "optimizer/validation/generation.h"
#include "optimizer/validation/length_check.h"
#include "optimizer/validation/parity.h"
#include "optimizer/validation/roofline.h"

namespace onnxopt {
namespace fs = std::filesystem;
namespace {

// What can run the result: contrib-op domains, or LayerNormalization before opset 17 (ONNX Runtime
// registers it in the ONNX domain for older opsets), narrow it to ONNX Runtime.
std::vector<std::string> Runtimes(const onnx::ModelProto& model, bool cuda) {
  const RuntimeRequirement needs = MinimumOnnxRuntime(model, cuda);
  const char* provider = cuda ? "CUDA" : "CPU";
  if (needs.version.empty()) return {absl::StrCat("no ONNX Runtime release onnxopt knows of runs it on the ", provider, ": ", needs.reason)};
  if (needs.contrib) {
    return {absl::StrCat("ONNX Runtime >= ", needs.version, " (", provider, "; ", needs.reason,
                         "; com.microsoft contrib operators)")};
  }
  return {absl::StrCat("any ONNX runtime supporting the model's opsets (standard operators only); ONNX Runtime >= ",
                       needs.version, " (", needs.reason, ")")};
}

absl::Status ConfigInvalid(const absl::Status& status) {
  return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::CONFIG_INVALID, status.message());
}

// Everything of a config but its pipeline (which needs the model for the auto preset).
absl::Status CheckSettings(const v1::OptimizationConfig& config) {
  absl::Status status = CheckValidationSettings(config.validation());
  if (status.ok()) status = CheckBenchmarkSettings(config.benchmark());
  if (status.ok()) status = CheckPrecisionConfig(config.precision());
  if (status.ok() && config.precision().mode() == v1::PrecisionConfig::auto_ && config.validation().skip()) {
    status = absl::InvalidArgumentError("precision.mode 'auto' validates every candidate: validation.skip cannot be set");
  }
  return status.ok() ? status : ConfigInvalid(status);
}

// ort_session.json: the fastest session settings the tuning found, to deploy with.
std::string TunedSettingsJson(const v1::SessionTuning& tuning, const std::string& provider) {
  const v1::TuningTrial& best = tuning.best();
  return absl::StrFormat(
      "{\n  \"intra_op_threads\": %d,\n  \"execution_mode\": \"%s\",\n  \"graph_optimization_level\": \"%s\",\n"
      "  \"p50_ms\": %.4f,\n  \"gain_over_defaults\": %.4f,\n  \"execution_provider\": \"%s\"\n}\n",
      best.intra_op_threads(), best.execution_mode(), best.optimization_level(), best.p50_ms(), tuning.gain(), provider);
}

// Peak memory, each model in a fresh session of its own (the first shape set's figures too).
void MeasurePeaks(const ModelSource& original, const ModelSource& optimized, const SessionSettings& settings,
                  const GeneratedInputs& inputs, v1::BenchmarkReport* benchmark) {
  const std::pair<const ModelSource*, v1::LatencyStats*> measured[] = {{&original, benchmark->mutable_original()},
                                                                       {&optimized, benchmark->mutable_optimized()}};
  for (const auto& [source, stats] : measured) {
    absl::StatusOr<int64_t> peak = MeasurePeakMemory(*source, settings, inputs);
    if (peak.ok()) stats->set_peak_memory_bytes(*peak);
  }
  if (benchmark->shapes_size() > 0) {
    benchmark->mutable_shapes(0)->mutable_original()->set_peak_memory_bytes(benchmark->original().peak_memory_bytes());
    benchmark->mutable_shapes(0)->mutable_optimized()->set_peak_memory_bytes(benchmark->optimized().peak_memory_bytes());
  }
}

// The session settings to deploy the result with, as the benchmark ran it.
void DescribeDeployment(const SessionSettings& settings, v1::BenchmarkReport* benchmark) {
  auto& deploy = *benchmark->mutable_deploy_settings();
  deploy["execution_provider"] = benchmark->execution_provider();
  deploy["graph_optimization_level"] = benchmark->ort_optimization_level();
  if (settings.intra_op_threads > 0) deploy["intra_op_num_threads"] = absl::StrCat(settings.intra_op_threads);
  if (settings.device != v1::DEVICE_CUDA) return;
  deploy["cuda.use_tf32"] = settings.cuda_tf32 ? "1" : "0";
  deploy["io_binding"] = "inputs and outputs on the device";
  // Worth deploying where the replay is faster beyond the noise of two medians.
  const v1::CudaGraphTiming& graph = benchmark->cuda_graph();
  deploy["cuda.enable_cuda_graph"] = graph.qualified() && graph.gain() > 1.02 ? "1" : "0";
}

}  // namespace

absl::StatusOr<ModelSource> SourceFor(const fs::path& path) {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot stat ", path.string()));
  fs::path data = path;
  data += ".data";
  if (fs::exists(data) || size > (uintmax_t{1} << 30)) return ModelSource{"", path};
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return ModelSource{*std::move(bytes), {}};
}

BackgroundShapes::BackgroundShapes(const onnx::ModelProto& model, bool start) {
  if (!start) return;
  thread_ = std::thread([this, &model] {
    try {
      shapes_ = InferInitialShapes(model);
    } catch (const std::exception&) {
      // Nothing handed over: the pipeline infers them itself.
    }
  });
}

BackgroundShapes::~BackgroundShapes() {
  if (thread_.joinable()) thread_.join();
}

std::optional<InitialShapes> BackgroundShapes::Take() {
  if (thread_.joinable()) thread_.join();
  return std::move(shapes_);
}

absl::StatusOr<SessionSettings> DeviceSettings(const v1::OptimizationConfig& config, v1::Report* report) {
  SessionSettings device;
  device.device = config.benchmark().device() == v1::DEVICE_CUDA ? v1::DEVICE_CUDA : v1::DEVICE_CPU;
  device.intra_op_threads = config.benchmark().intra_op_threads();
  if (absl::StatusOr<std::string> provider = ProviderFor(device.device); !provider.ok()) {
    if (!config.benchmark().allow_cpu_fallback()) return provider.status();
    const std::string fallback = absl::StrCat("CUDA was asked for but is not available (", provider.status().message(),
                                              "); everything ran on the CPU because benchmark.allow_cpu_fallback is set");
    report->mutable_benchmark()->set_fallback(fallback);
    report->add_warnings(fallback);
    device.device = v1::DEVICE_CPU;
  }
  return device;
}

SessionSettings BenchmarkSettings(const v1::OptimizationConfig& config, const SessionSettings& device,
                                  v1::BenchmarkReport* benchmark) {
  SessionSettings settings = device;
  settings.optimization_level = OrtLevel(config.benchmark().ort_optimization_level(), ORT_ENABLE_ALL);
  settings.allow_spinning = false;  // two sessions in turns: see SessionSettings
  benchmark->set_thread_spinning(settings.allow_spinning);
  benchmark->set_device(settings.device == v1::DEVICE_CUDA ? "CUDA GPU" : CpuDescription());
  benchmark->set_execution_provider(*ProviderFor(settings.device));
  benchmark->set_ort_optimization_level(OrtLevelName(settings.optimization_level));
  benchmark->set_execution_mode("sequential");
  return settings;
}

absl::Status CheckConfig(const v1::OptimizationConfig& config) {
  absl::StatusOr<Pipeline> pipeline = BuildPipeline(config, DefaultPassRegistry());
  if (!pipeline.ok()) return ConfigInvalid(pipeline.status());
  return CheckSettings(config);
}

absl::Status CheckModel(const onnx::ModelProto& model, std::vector<std::string>* warnings) {
  const int64_t opset = DefaultOpset(model);
  if (opset > kMaxCheckedOpset) {
    warnings->push_back(absl::StrCat(
        "model uses opset ", opset, ", newer than the ", kMaxCheckedOpset, " onnx 1.12 knows: the ONNX checker was skipped",
        opset <= kLastAdaptedOpset
            ? "; shapes are inferred with opset 17's rules for the operators whose shapes have not changed since"
            : " and passes that need shapes leave such graphs alone"));
    return absl::OkStatus();
  }
  EnsureContribSchemas();  // the checker sees the same registry whatever ran before
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_CHECK_FAILED, e.what());
  }
  return absl::OkStatus();
}

v1::ModelSummary Summarize(const onnx::ModelProto& model, int64_t model_bytes) {
  v1::ModelSummary summary;
  summary.set_nodes(CountNodes(model.graph()));
  summary.set_initializers(model.graph().initializer_size());
  int64_t initializer_bytes = 0;
  for (const auto& tensor : model.graph().initializer()) initializer_bytes += TensorDataBytes(tensor);
  summary.set_initializer_bytes(initializer_bytes);
  summary.set_model_bytes(model_bytes);
  for (const auto& op : OpHistogram(model.graph())) (*summary.mutable_op_histogram())[op.first] = op.second;
  for (const auto& opset : model.opset_import()) {
    (*summary.mutable_opset_imports())[opset.domain().empty() ? "ai.onnx" : opset.domain()] = opset.version();
  }
  return summary;
}

OptimizeJob::OptimizeJob(const OptimizeRequest& request)
    : request_(request), config_(request.config), start_(std::chrono::steady_clock::now()) {
  report_.set_optimizer_version(kOptimizerVersion);
  report_.set_job(request.job_name);  // the server names it again once the job ends
}

absl::StatusOr<OptimizeResult> OptimizeJob::Run(v1::Report* partial_report) {
  struct Stage {
    const char* name;  // in the report's memory section
    absl::Status (OptimizeJob::*run)();
  };
  static constexpr Stage kStages[] = {
      {"load", &OptimizeJob::LoadAndCheck},      {"passes", &OptimizeJob::RunPasses},
      {"precision", &OptimizeJob::ApplyPrecision}, {"save", &OptimizeJob::Save},
      {"validation", &OptimizeJob::Validate},    {"benchmark", &OptimizeJob::RunBenchmark},
      {"delivery", &OptimizeJob::Deliver}};
  absl::Status status = absl::OkStatus();
  for (const Stage& stage : kStages) {
    const auto stage_start = std::chrono::steady_clock::now();
    StartResidentPeakWindow();
    status = (this->*stage.run)();
    RecordStageMemory(stage.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - stage_start).count());
    if (!status.ok()) break;
  }
  if (status.ok()) {
    report_.set_returned_original(validation_.returned_original);
    if (rewritten_.precision_requested) {
      report_.mutable_precision()->set_precision(
          validation_.returned_original ? "fp32" : ModelPrecision(rewritten_.optimized));
    }
  }
  report_.set_total_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  MakeStringsValidUtf8(&report_);  // names and op types are the model's own bytes
  if (partial_report != nullptr) *partial_report = report_;
  if (!status.ok()) return status;
  return std::move(result_);
}

void OptimizeJob::RecordStageMemory(const char* stage, double seconds) {
  v1::MemoryReport* memory = report_.mutable_memory();
  v1::StageMemory* described = memory->add_stages();
  described->set_stage(stage);
  described->set_seconds(seconds);
  if (std::optional<int64_t> resident = ResidentBytes()) described->set_resident_bytes_after(*resident);
  if (std::optional<int64_t> peak = ResidentPeakInWindow()) {
    described->set_peak_resident_bytes(std::max(*peak, described->resident_bytes_after()));  // read in turn
  }
  memory->set_peak_resident_bytes(std::max(memory->peak_resident_bytes(), described->peak_resident_bytes()));
  memory->set_model_bytes(report_.original().model_bytes());
  if (memory->model_bytes() > 0) {
    memory->set_peak_over_model(static_cast<double>(memory->peak_resident_bytes()) /
                                static_cast<double>(memory->model_bytes()));
  }
}

void OptimizeJob::Progress(Phase phase, const std::string& step) const {
  if (request_.on_progress) request_.on_progress(phase, step, 0, 0);
}

PassManagerOptions OptimizeJob::PassOptions() const {
  PassManagerOptions options;
  options.run = request_.run;
  options.on_pass_start = [this](const std::string& pass, int done, int total) {
    if (request_.on_progress) request_.on_progress(Phase::kOptimizing, pass, done, total);
  };
  return options;
}

std::vector<v1::PassReport> OptimizeJob::AllRuns(const std::vector<v1::PassReport>& lower) const {
  std::vector<v1::PassReport> runs = rewritten_.pass_reports;
  runs.insert(runs.end(), lower.begin(), lower.end());
  return runs;
}

// The onnx checker is stricter than ONNX Runtime (design.md: what ONNX Runtime runs, onnxopt takes): a
// model it refuses after loading's normalization is still taken when ONNX Runtime loads it, with the
// checker's words as a warning, and refused with ONNX Runtime's own words when ONNX Runtime does not.
absl::Status OptimizeJob::TakeWhatOnnxRuntimeLoads(const absl::Status& checker, std::vector<std::string>* warnings) {
  SessionSettings settings;
  settings.optimization_level = ORT_DISABLE_ALL;  // loading is the question, not speed
  settings.prepack_weights = false;
  absl::StatusOr<std::unique_ptr<Ort::Session>> session = CreateSession(OriginalSource(), settings);
  if (!session.ok()) {
    // The checker's words first: they are short, and ONNX Runtime's may quote megabytes of the model's
    // names before they say what is wrong (a job's error is cut to a few KiB).
    constexpr size_t kRuntimeWordsBytes = 1024;
    absl::string_view runtime_words = TextOf(session.status());
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_CHECK_FAILED,
                   absl::StrCat("the ONNX checker: ", TextOf(checker), "; and ",
                                runtime_words.substr(0, kRuntimeWordsBytes),
                                runtime_words.size() > kRuntimeWordsBytes ? " [...]" : ""));
  }
  warnings->push_back(absl::StrCat("the ONNX checker refuses the model (", TextOf(checker),
                                   "); ONNX Runtime loads it, so it is taken as ONNX Runtime reads it"));
  return absl::OkStatus();
}

absl::Status OptimizeJob::LoadAndCheck() {
  Progress(Phase::kLoading);
  if (absl::Status settings = CheckSettings(config_); !settings.ok()) return settings;
  // Big tensors stay in their files: the original and its optimized copy share them, and the result
  // is written file to file, so a model costs memory for its graph and what passes make.
  absl::StatusOr<onnx::ModelProto> original = LoadModelByReference(request_.model_path);
  if (!original.ok()) return original.status();
  loaded_.original = *std::move(original);
  for (std::string& line : NormalizeAsOnnxRuntimeReads(&*loaded_.original)) report_.add_normalizations(std::move(line));
  // For the delivered model's lineage: loaded_.original may be released before then.
  loaded_.source_producer =
      absl::StrCat(loaded_.original->producer_name(), loaded_.original->producer_version().empty() ? "" : " ",
                   loaded_.original->producer_version());
  // Built before the model is checked (its errors are reported after the check's), so that the shapes
  // the pipeline starts from can be inferred on another thread while this one checks and describes
  // the model: all of it only reads the model, and the inference is 15% of a 100k-node run.
  absl::StatusOr<Pipeline> pipeline = BuildPipeline(config_, DefaultPassRegistry(), &*loaded_.original);
  loaded_.initial_shapes =
      std::make_unique<BackgroundShapes>(*loaded_.original, pipeline.ok() && InfersShapesFirst(*pipeline, {}));
  std::vector<std::string> warnings;
  absl::Status check = CheckModel(*loaded_.original, &warnings);
  if (!check.ok()) check = TakeWhatOnnxRuntimeLoads(check, &warnings);
  for (auto& warning : warnings) report_.add_warnings(std::move(warning));
  if (!check.ok()) return check;
  *report_.mutable_original() = Summarize(*loaded_.original, ModelBytes(*loaded_.original));
  if (const int64_t bytes = report_.original().model_bytes(); ModelExceedsMemory(bytes)) {
    loaded_.exceeds_memory = true;
    constexpr double kGiB = 1 << 30;
    report_.mutable_memory()->set_original_from_disk(absl::StrFormat(
        "the original (%.2f GiB) does not fit in the %.2f GiB this job may hold: its sessions run from the "
        "memory-mapped files without prepacked weights, every run reading them from the disk",
        bytes / kGiB, JobMemoryTarget(bytes) / kGiB));
  }
  absl::StatusOr<std::vector<SuppliedSample>> supplied = LoadSuppliedInputs(request_.input_files);
  if (!supplied.ok()) return supplied.status();
  loaded_.supplied = *std::move(supplied);
  if (!pipeline.ok()) return ConfigInvalid(pipeline.status());
  loaded_.pipeline = *std::move(pipeline);
  report_.set_pipeline(loaded_.pipeline->preset);
  return absl::OkStatus();
}

absl::Status OptimizeJob::RunPasses() {
  Progress(Phase::kOptimizing);
  // Past the pipeline the original is read by validation, the benchmark and calibration; the report
  // needs only what detection reads from it. Without those the pipeline takes the original itself:
  // copying a 100k-node graph cost 0.13 s and the memory of a second graph.
  rewritten_.original_evidence = ReadTransformerEvidence(*loaded_.original);
  if (loaded_.initial_shapes->started()) {
    OrtEnvironment();  // made here, where the inference hides it, not in fold_constants
  }
  std::optional<InitialShapes> shapes = loaded_.initial_shapes->Take();  // before the model moves
  rewritten_.precision_requested = PrecisionRequested(config_.precision());
  const bool original_needed =
      !config_.validation().skip() || !config_.benchmark().skip() || rewritten_.precision_requested;
  if (original_needed) {
    rewritten_.optimized = *loaded_.original;
  } else {
    rewritten_.optimized = *std::move(loaded_.original);
    loaded_.original.reset();
  }
  // CUDA asked for but falling back to the CPU (allow_cpu_fallback): device-specific forms
  // (remove_padding's) are the CPU's.
  if (loaded_.pipeline->hints.device == v1::DEVICE_CUDA) {
    if (absl::StatusOr<SessionSettings> device = Device(); device.ok()) loaded_.pipeline->hints.device = device->device;
  }
  absl::Status passes =
      RunPipeline(*loaded_.pipeline, &rewritten_.optimized, PassOptions(), &rewritten_.pass_reports, std::move(shapes));
  for (const auto& pass_report : rewritten_.pass_reports) *report_.add_passes() = pass_report;
  return passes;
}

// Lower precision comes after the pipeline, its runs reported with it but kept apart for the
// bisection (which replays the pipeline alone).
absl::Status OptimizeJob::ApplyPrecision() {
  if (!rewritten_.precision_requested) return absl::OkStatus();
  const v1::PrecisionConfig& precision = config_.precision();
  rewritten_.fp32_model = rewritten_.optimized;
  if (precision.mode() == v1::PrecisionConfig::auto_) return absl::OkStatus();  // chosen in validation: ChoosePrecision
  if (precision.mode() == v1::PrecisionConfig::int8_static) {
    Progress(Phase::kOptimizing, "calibration");
    SessionSettings cpu;
    cpu.intra_op_threads = config_.benchmark().intra_op_threads();
    cpu = ForOriginal(cpu);
    std::string warning;
    absl::StatusOr<std::map<std::string, ValueRange>> ranges =
        CalibrateActivations(rewritten_.fp32_model, Original(), precision, config_.validation(), loaded_.supplied, cpu,
                             request_.run, &warning);
    if (!ranges.ok()) return ranges.status();
    rewritten_.calibrated.activation_ranges = *std::move(ranges);
    if (!warning.empty()) report_.add_warnings(warning);
  }
  absl::Status converted = onnxopt::ApplyPrecision(precision, rewritten_.calibrated, PassOptions(),
                                                   &rewritten_.optimized, &rewritten_.precision_runs);
  for (const auto& pass_report : rewritten_.precision_runs) *report_.add_passes() = pass_report;
  if (!converted.ok()) return converted;
  DescribePrecision(precision, rewritten_.fp32_model, rewritten_.optimized, rewritten_.precision_runs,
                    report_.mutable_precision());
  if (precision.mode() == v1::PrecisionConfig::int4_weight_only) {
    Progress(Phase::kOptimizing, "int4 error per projection");
    SessionSettings cpu;
    cpu.intra_op_threads = config_.benchmark().intra_op_threads();
    // The float32 model's session holds about its bytes again: only where that fits the job's target.
    auto activations_fit = [&]() -> absl::Status {
      const int64_t model_bytes = ModelBytes(rewritten_.fp32_model), held = ResidentBytes().value_or(0);
      const int64_t target = JobMemoryTarget(report_.original().model_bytes());
      if (held + model_bytes <= target) return absl::OkStatus();
      constexpr double kGiB = 1 << 30;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the float32 model's session (%.2f GiB) beside the %.2f GiB held would pass the job's memory target of "
          "%.2f GiB", model_bytes / kGiB, held / kGiB, target / kGiB));
    };
    DescribeInt4Errors(rewritten_.fp32_model, rewritten_.optimized, Original(), precision, config_.validation(),
                       loaded_.supplied, cpu, request_.run, activations_fit, report_.mutable_precision());
  }
  // keep_io_types off: the result reads and writes float16; parity and the benchmark use it behind
  // Casts to the original's interface (the report says so).
  rewritten_.interface_changed = ChangesFloatInterface(precision, precision.mode());
  if (rewritten_.interface_changed) {
    report_.add_warnings("precision.keep_io_types is off: the model's float inputs and outputs are now " +
                         v1::PrecisionConfig::Mode_Name(precision.mode()) +
                         "; parity and the benchmark ran it behind Casts from and to float32");
  }
  return absl::OkStatus();
}

absl::Status OptimizeJob::SaveResult(const onnx::ModelProto& model, const std::vector<v1::PassReport>& runs) {
  SaveOptions save;
  save.durable = request_.durable_output;
  absl::StatusOr<std::vector<fs::path>> files = SaveModel(model, saved_.output_path, save);
  if (!files.ok()) return files.status();
  std::error_code error;
  auto is_model_file = [&](const fs::path& file) {
    return std::find(saved_.model_files.begin(), saved_.model_files.end(), file) != saved_.model_files.end();
  };
  for (const auto& stale : saved_.model_files) {
    if (std::find(files->begin(), files->end(), stale) == files->end()) fs::remove(stale, error);
  }
  // The model's files first, then what was written beside it (ort_session.json, the adapter).
  std::vector<fs::path> beside;
  for (const auto& file : result_.files) {
    if (!is_model_file(file)) beside.push_back(file);
  }
  saved_.model_files = *files;
  result_.files = *files;
  result_.files.insert(result_.files.end(), beside.begin(), beside.end());
  int64_t saved_bytes = 0;
  for (const auto& file : saved_.model_files) saved_bytes += static_cast<int64_t>(fs::file_size(file, error));
  *report_.mutable_optimized() = Summarize(model, saved_bytes);
  report_.clear_runtimes();
  for (auto& runtime : Runtimes(model, config_.benchmark().device() == v1::DEVICE_CUDA)) {
    report_.add_runtimes(std::move(runtime));
  }
  *report_.mutable_transformer() =
      JudgeTransformerFusion(rewritten_.original_evidence, model, runs, loaded_.pipeline->hints);
  return absl::OkStatus();
}

absl::Status OptimizeJob::Save() {
  Progress(Phase::kSaving);
  if (Cancelled()) return absl::CancelledError("cancelled before saving");
  std::error_code error;
  fs::create_directories(request_.output_dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", request_.output_dir.string()));
  saved_.output_path = request_.output_dir / kModelFileName;
  if (absl::Status saved = SaveResult(rewritten_.optimized, AllRuns(rewritten_.precision_runs)); !saved.ok()) {
    return saved;
  }
  report_.mutable_parity()->set_skipped(config_.validation().skip());
  report_.mutable_benchmark()->set_skipped(config_.benchmark().skip());
  return absl::OkStatus();
}

absl::StatusOr<ModelSource> OptimizeJob::SourceOf(const onnx::ModelProto& model, bool saved) const {
  if (saved && !rewritten_.interface_changed) return SourceFor(saved_.output_path);
  return RuntimeSource(rewritten_.interface_changed ? WithOriginalInterface(model, Original()) : model);
}

absl::StatusOr<SessionSettings> OptimizeJob::Device() {
  if (!saved_.device) saved_.device = DeviceSettings(config_, &report_);
  return *saved_.device;
}

SessionSettings OptimizeJob::ForOriginal(SessionSettings settings) const {
  if (loaded_.exceeds_memory) settings.prepack_weights = false;
  return settings;
}

const ModelSource& OptimizeJob::OriginalSource() {
  // By path, ONNX Runtime reading the file (and its external data) itself: a serialized copy held for
  // the whole job would cost the model's bytes once more.
  if (!saved_.original_source) saved_.original_source = ModelSource{"", request_.model_path};
  return *saved_.original_source;
}

// CUDA, after the device-resident benchmark: both models with host copies (a caller with host tensors
// pays them), and the result replayed as a CUDA graph, each on a quarter of the budget.
absl::Status OptimizeJob::TimeOnDevice(Ort::Session& original, Ort::Session& optimized,
                                       const ModelSource& optimized_source, const SessionSettings& settings,
                                       const std::vector<GeneratedInputs>& inputs, v1::BenchmarkReport* benchmark) {
  const double budget = TimeBudget(config_.benchmark()) / 4;
  Progress(Phase::kBenchmarking, "with host copies");
  v1::BenchmarkConfig copies_config = config_.benchmark();
  copies_config.set_time_budget_seconds(budget);
  v1::BenchmarkReport with_copies;
  TimingMode host_bound = TimingOn(settings.device);
  host_bound.residence = Residence::kHost;
  absl::Status timed = Benchmark(original, optimized, inputs, copies_config, request_.run, &with_copies, host_bound);
  if (!timed.ok()) return timed;
  *benchmark->mutable_original_with_copies() = with_copies.original();
  *benchmark->mutable_optimized_with_copies() = with_copies.optimized();
  Progress(Phase::kBenchmarking, "CUDA graph");
  absl::StatusOr<v1::CudaGraphTiming> graph =
      TimeCudaGraph(optimized_source, optimized, settings, inputs.front(), budget, request_.run);
  if (!graph.ok()) return graph.status();
  *benchmark->mutable_cuda_graph() = *graph;
  return absl::OkStatus();
}

// Whether the two models' sessions may be open together while they are timed: as the config says, or
// (auto) when both models' bytes fit in the job's memory target beside what the process holds now.
// The report's memory section says which and why.
bool OptimizeJob::SessionsSideBySide() {
  const int64_t original_bytes = report_.original().model_bytes(), optimized_bytes = report_.optimized().model_bytes();
  const int64_t target = JobMemoryTarget(original_bytes);
  const int64_t held = ResidentBytes().value_or(0);
  std::string described;
  bool side_by_side = true;
  switch (config_.benchmark().sessions()) {
    case v1::BENCHMARK_SESSIONS_SIDE_BY_SIDE:
      described = "side by side: benchmark.sessions asks for it";
      break;
    case v1::BENCHMARK_SESSIONS_ALTERNATING:
      side_by_side = false;
      described = "alternating: benchmark.sessions asks for it";
      break;
    default:
      side_by_side = held + original_bytes + optimized_bytes <= target;
      constexpr double kGiB = 1 << 30;
      described = absl::StrFormat(
          "%s: both models (%.2f + %.2f GiB) beside the %.2f GiB held %s the job's memory target of %.2f GiB "
          "(1.5x the original + 1 GiB%s)",
          side_by_side ? "side by side" : "alternating", original_bytes / kGiB, optimized_bytes / kGiB, held / kGiB,
          side_by_side ? "fit in" : "would pass", target / kGiB,
          AddressSpaceLimit() ? ", within the address-space limit" : "");
  }
  report_.mutable_memory()->set_benchmark_sessions(described);
  return side_by_side;
}

// Both sessions open, runs interleaved pair by pair: the one-shot benchmark, CUDA's extra figures and
// generation. The inputs it timed on.
absl::StatusOr<std::vector<GeneratedInputs>> OptimizeJob::TimeSideBySide(const ModelSource& optimized_source,
                                                                        const SessionSettings& settings) {
  v1::BenchmarkReport* benchmark = report_.mutable_benchmark();
  auto original_session = CreateSession(OriginalSource(), settings);
  if (!original_session.ok()) return original_session.status();
  auto optimized_session = CreateSession(optimized_source, settings);
  if (!optimized_session.ok()) {
    return absl::InternalError(absl::StrCat("the optimized model does not load in ONNX Runtime: ",
                                            optimized_session.status().message()));
  }
  absl::StatusOr<std::vector<GeneratedInputs>> inputs =
      BenchmarkInputs(**original_session, Original(), config_.validation(), loaded_.supplied);
  if (!inputs.ok()) return inputs.status();
  // On CUDA the figures are device-resident; the host copies and CUDA graphs are timed after.
  const TimingMode mode = TimingOn(settings.device);
  absl::Status timed =
      Benchmark(**original_session, **optimized_session, *inputs, config_.benchmark(), request_.run, benchmark, mode);
  if (!timed.ok()) return timed;
  if (mode.bound) {
    absl::Status device_timed =
        TimeOnDevice(**original_session, **optimized_session, optimized_source, settings, *inputs, benchmark);
    if (!device_timed.ok()) return device_timed;
  }
  Progress(Phase::kBenchmarking, "generation");
  absl::Status generation = ReportGeneration(
      **original_session, **optimized_session,
      {Original(), config_.benchmark(), mode, ExactTokensFor(rewritten_.optimized)}, request_.run, &report_);
  if (!generation.ok()) return generation;
  return inputs;
}

// One session open at a time (SessionsSideBySide said no): the one-shot benchmark and generation in
// alternating rounds. CUDA's host-copy and CUDA-graph figures need both sessions and are left out.
absl::StatusOr<std::vector<GeneratedInputs>> OptimizeJob::TimeAlternating(const ModelSource& optimized_source,
                                                                         const SessionSettings& settings) {
  v1::BenchmarkReport* benchmark = report_.mutable_benchmark();
  absl::StatusOr<std::vector<GeneratedInputs>> inputs;
  {
    auto original_session = CreateSession(OriginalSource(), settings);
    if (!original_session.ok()) return original_session.status();
    inputs = BenchmarkInputs(**original_session, Original(), config_.validation(), loaded_.supplied);
  }
  if (!inputs.ok()) return inputs.status();
  const TimingMode mode = TimingOn(settings.device);
  absl::Status timed = BenchmarkAlternating(OriginalSource(), optimized_source, settings, *inputs, config_.benchmark(),
                                            request_.run, benchmark, mode);
  if (!timed.ok()) return timed;
  if (mode.bound) {
    report_.add_warnings("the benchmark's sessions alternated (see memory.benchmark_sessions): CUDA's timings with "
                         "host copies and as a CUDA graph need both open and were left out");
  }
  Progress(Phase::kBenchmarking, "generation");
  absl::Status generation = ReportGenerationAlternating(
      OriginalSource(), optimized_source, settings,
      {Original(), config_.benchmark(), mode, ExactTokensFor(rewritten_.optimized)}, request_.run, &report_);
  if (!generation.ok()) return generation;
  return inputs;
}

// A model larger than memory: timing the original would read it all from the disk on every run (minutes
// a decode step's worth of figures), so the result is timed alone, each input set and each generation
// phase, and the report says so. No speedup, no regression check, no tuning against it.
absl::Status OptimizeJob::TimeResultAlone(const ModelSource& optimized_source, const SessionSettings& settings) {
  v1::BenchmarkReport* benchmark = report_.mutable_benchmark();
  benchmark->set_original_not_timed(
      "the original does not fit in memory (memory.original_from_disk): each of its runs would read every weight "
      "from the disk; the optimized model was timed alone");
  report_.mutable_memory()->set_benchmark_sessions("the optimized model's session alone: the original was not timed");
  auto session = CreateSession(optimized_source, settings);
  if (!session.ok()) {
    return absl::InternalError(
        absl::StrCat("the optimized model does not load in ONNX Runtime: ", session.status().message()));
  }
  absl::StatusOr<std::vector<GeneratedInputs>> inputs =
      BenchmarkInputs(**session, Original(), config_.validation(), loaded_.supplied);
  if (!inputs.ok()) return inputs.status();
  const TimingMode mode = TimingOn(settings.device);
  absl::Status timed = BenchmarkAlone(**session, *inputs, config_.benchmark(), request_.run, benchmark, mode);
  if (!timed.ok()) return timed;
  Progress(Phase::kBenchmarking, "generation");
  const OriginalOpener open_original = [&]() {
    Progress(Phase::kBenchmarking, "the original scoring the greedy generation (from the disk)");
    return CreateSession(OriginalSource(), ForOriginal(settings));
  };
  return ReportGenerationOfResult(**session, open_original,
                                  {Original(), config_.benchmark(), mode, ExactTokensFor(rewritten_.optimized)},
                                  request_.run, &report_);
}

// Times the original against the result (the file just written), measures both sessions' peak
// memory and, when asked, searches the fastest session settings for the result; a regression may
// return the original.
absl::Status OptimizeJob::RunBenchmark() {
  if (config_.benchmark().skip()) return absl::OkStatus();
  Progress(Phase::kBenchmarking);
  absl::StatusOr<SessionSettings> device = Device();
  if (!device.ok()) return device.status();
  v1::BenchmarkReport* benchmark = report_.mutable_benchmark();
  const SessionSettings settings = BenchmarkSettings(config_, *device, benchmark);
  absl::StatusOr<ModelSource> optimized_source = SourceOf(rewritten_.optimized, /*saved=*/true);
  if (!optimized_source.ok()) return optimized_source.status();
  // A decoder's decode steps on the CPU are judged against the memory roofline (host memory's: on CUDA it
  // would be the device's, which this probe does not measure). Measured before any session opens, the
  // probe's buffer adds nothing to the job's peak.
  const bool decoder = FindCacheInterface(Original().graph()).has_value() && !config_.benchmark().generation().skip();
  const double bandwidth =
      decoder && settings.device == v1::DEVICE_CPU ? MemoryReadBandwidth(settings.intra_op_threads) : 0;
  if (loaded_.exceeds_memory) {
    absl::Status timed = TimeResultAlone(*optimized_source, settings);
    if (!timed.ok()) return timed;
    if (report_.has_generation()) {
      DescribeRoofline(Original(), rewritten_.optimized, bandwidth, report_.mutable_generation());
    }
    DescribeDeployment(settings, benchmark);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<GeneratedInputs>> inputs = SessionsSideBySide()
                                                            ? TimeSideBySide(*optimized_source, settings)
                                                            : TimeAlternating(*optimized_source, settings);
  if (!inputs.ok()) return inputs.status();
  if (report_.has_generation()) {
    DescribeRoofline(Original(), rewritten_.optimized, bandwidth, report_.mutable_generation());
  }
  DescribeDeployment(settings, benchmark);
  MeasurePeaks(OriginalSource(), *optimized_source, settings, inputs->front(), benchmark);  // one session at a time
  if (config_.benchmark().tune_session()) {
    absl::StatusOr<v1::SessionTuning> tuning =
        TuneSession(*optimized_source, *device, inputs->front(), TimeBudget(config_.benchmark()), request_.run);
    if (!tuning.ok()) return tuning.status();
    *benchmark->mutable_tuning() = *tuning;
    const fs::path path = saved_.output_path.parent_path() / kSessionSettingsFileName;
    absl::Status written = WriteFileAtomically(path, TunedSettingsJson(*tuning, benchmark->execution_provider()));
    if (!written.ok()) return written;
    result_.files.push_back(path);
  }
  const double band = config_.benchmark().stability() > 0 ? config_.benchmark().stability() : 0.02;
  if (std::vector<std::string> slower = SlowerPhases(report_, band); !slower.empty()) {
    report_.add_warnings(absl::StrCat("the optimized model is slower than the original in ", slower.size(),
                                      slower.size() == 1 ? " phase the benchmark timed: " : " phases the benchmark timed: ",
                                      absl::StrJoin(slower, "; ")));
  }
  const DecidingPhase decided =
      JudgeDecidingPhase(report_, config_.benchmark(), ModelPrecision(rewritten_.optimized) == "int4", band);
  if (!decided.slower) return absl::OkStatus();
  // An extracted adapter changes what the model takes (its low-rank matrices become inputs): the original
  // has none to give, so the model asked for comes back, slower or not.
  const bool extracted_adapter = !AdapterInputs(rewritten_.optimized).empty();
  const bool return_original = config_.benchmark().on_regression() != v1::ON_REGRESSION_REPORT && !extracted_adapter;
  report_.add_warnings(absl::StrCat(
      "the optimized model is slower than the original beyond the noise in the phase that decides (", decided.name,
      "): ", decided.described,
      return_original     ? "; the original model is returned"
      : extracted_adapter ? "; returned all the same (its adapter was extracted, which the original cannot give)"
                          : "; returned all the same (on_regression REPORT)"));
  if (!return_original || validation_.returned_original) return absl::OkStatus();
  validation_.returned_original = true;
  report_.add_warnings(absl::StrCat("the pipeline's output (", report_.optimized().nodes(),
                                    " nodes) was slower; the report's model sections describe the returned "
                                    "original, its benchmark section the pipeline's output"));
  absl::Status resaved = SaveResult(Original(), {});  // the report now describes the file returned
  if (!resaved.ok()) return resaved;
  report_.mutable_benchmark()->clear_tuning();  // it tuned the model that is not returned
  return absl::OkStatus();
}

absl::StatusOr<OptimizeResult> Optimize(const OptimizeRequest& request, v1::Report* partial_report) {
  return OptimizeJob(request).Run(partial_report);
}

}  // namespace onnxopt
