#include "optimizer/optimize.h"

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
#include "optimizer/contrib_schemas.h"
#include "optimizer/graph.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/precision.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/bisect.h"
#include "optimizer/validation/calibration.h"
#include "optimizer/validation/length_check.h"
#include "optimizer/validation/parity.h"
#include "optimizer/transformer_report.h"
#include "optimizer/utf8.h"

namespace onnxopt {
namespace fs = std::filesystem;
namespace {

bool Cancelled(const OptimizeRequest& request) { return request.cancelled != nullptr && request.cancelled->load(); }

void Progress(const OptimizeRequest& request, Phase phase) {
  if (request.on_progress) request.on_progress(phase, "", 0, 0);
}

// What can run the result: contrib-op domains, or LayerNormalization before opset 17 (ONNX Runtime
// registers it in the ONNX domain for older opsets), narrow it to ONNX Runtime.
std::vector<std::string> Runtimes(const v1::ModelSummary& summary) {
  bool contrib = false;
  for (const auto& op : summary.op_histogram()) contrib |= op.first.find("com.microsoft::") == 0;
  auto opset = summary.opset_imports().find("ai.onnx");
  const bool early_layer_norm = summary.op_histogram().count("LayerNormalization") > 0 &&
                                opset != summary.opset_imports().end() && opset->second < 17;
  if (contrib) return {"ONNX Runtime (uses com.microsoft contrib operators)"};
  if (early_layer_norm) return {"ONNX Runtime (LayerNormalization below opset 17 is ONNX Runtime's)"};
  return {"any ONNX runtime supporting the model's opsets (standard operators only)"};
}

// ONNX Runtime reads the model from memory unless it is too big for one protobuf message.
absl::StatusOr<ModelSource> SourceFor(const fs::path& path) {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot stat ", path.string()));
  bool has_external = false;
  fs::path data = path;
  data += ".data";
  has_external = fs::exists(data);
  if (has_external || size > (uintmax_t{1} << 30)) return ModelSource{"", path};
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return ModelSource{*std::move(bytes), {}};
}

std::string CulpritList(const v1::Bisection& bisection) {
  std::vector<std::string> names;
  for (const auto& culprit : bisection.culprits()) {
    names.push_back(absl::StrCat(culprit.pass(), " (run ", culprit.position(), ", sweep ", culprit.iteration(), ")"));
  }
  return absl::StrJoin(names, ", then ");
}

absl::StatusOr<OptimizeResult> Finish(std::chrono::steady_clock::time_point start, v1::Report* partial_report,
                                      OptimizeResult* result) {
  result->report.set_total_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  MakeStringsValidUtf8(&result->report);  // names and op types are the model's own bytes
  if (partial_report != nullptr) *partial_report = result->report;
  return std::move(*result);
}

// Times the original against the result (the file just written), measures both sessions' peak
// memory and, when asked, searches the fastest session settings for the result.
absl::Status RunBenchmark(const OptimizeRequest& request, const onnx::ModelProto& original,
                          const ModelSource& original_source, const onnx::ModelProto& optimized,
                          const fs::path& output_path, const SessionSettings& device,
                          const std::vector<SuppliedSample>& supplied, v1::Report* report, OptimizeResult* result,
                          const ModelSource* optimized_view = nullptr) {
  const v1::OptimizationConfig& config = request.config;
  v1::BenchmarkReport* benchmark = report->mutable_benchmark();
  const SessionSettings settings = BenchmarkSettings(config, device, benchmark);
  absl::StatusOr<ModelSource> optimized_source =
      optimized_view != nullptr ? absl::StatusOr<ModelSource>(*optimized_view) : SourceFor(output_path);
  if (!optimized_source.ok()) return optimized_source.status();
  auto original_session = CreateSession(original_source, settings);
  if (!original_session.ok()) return original_session.status();
  auto optimized_session = CreateSession(*optimized_source, settings);
  if (!optimized_session.ok()) {
    return absl::InternalError(absl::StrCat("the optimized model does not load in ONNX Runtime: ",
                                            optimized_session.status().message()));
  }
  absl::StatusOr<std::vector<GeneratedInputs>> inputs =
      BenchmarkInputs(**original_session, original, config.validation(), supplied);
  if (!inputs.ok()) return inputs.status();
  absl::Status timed = Benchmark(**original_session, **optimized_session, *inputs, config.benchmark(), request.cancelled,
                                 benchmark);
  if (!timed.ok()) return timed;
  // Peak memory, each model in a fresh session of its own.
  const std::pair<const ModelSource*, v1::LatencyStats*> measured[] = {{&original_source, benchmark->mutable_original()},
                                                                       {&*optimized_source, benchmark->mutable_optimized()}};
  for (const auto& [source, stats] : measured) {
    absl::StatusOr<int64_t> peak = MeasurePeakMemory(*source, settings, inputs->front());
    if (peak.ok()) stats->set_peak_memory_bytes(*peak);
  }
  if (benchmark->shapes_size() > 0) {
    benchmark->mutable_shapes(0)->mutable_original()->set_peak_memory_bytes(benchmark->original().peak_memory_bytes());
    benchmark->mutable_shapes(0)->mutable_optimized()->set_peak_memory_bytes(benchmark->optimized().peak_memory_bytes());
  }
  if (config.benchmark().tune_session()) {
    const double budget = config.benchmark().time_budget_seconds() > 0 ? config.benchmark().time_budget_seconds()
                                                                       : kDefaultTimeBudgetSeconds;
    absl::StatusOr<v1::SessionTuning> tuning = TuneSession(*optimized_source, device, inputs->front(), budget, request.cancelled);
    if (!tuning.ok()) return tuning.status();
    *benchmark->mutable_tuning() = *tuning;
    const v1::TuningTrial& best = tuning->best();
    const std::string settings_json = absl::StrFormat(
        "{\n  \"intra_op_threads\": %d,\n  \"execution_mode\": \"%s\",\n  \"graph_optimization_level\": \"%s\",\n"
        "  \"p50_ms\": %.4f,\n  \"gain_over_defaults\": %.4f,\n  \"execution_provider\": \"%s\"\n}\n",
        best.intra_op_threads(), best.execution_mode(), best.optimization_level(), best.p50_ms(), tuning->gain(),
        benchmark->execution_provider());
    const fs::path path = output_path.parent_path() / "ort_session.json";
    absl::Status written = WriteFileAtomically(path, settings_json);
    if (!written.ok()) return written;
    result->files.push_back(path);
  }
  return absl::OkStatus();
}

// The graph input remove_padding packed the model by (behind Casts), when it changed the model; its
// result is judged on that mask's valid positions.
std::string PaddingMaskInput(const std::vector<v1::PassReport>& runs, const onnx::ModelProto& model) {
  bool ran = false;
  for (const auto& run : runs) ran |= run.name() == "remove_padding" && run.rewrites() > 0;
  if (!ran) return "";
  std::unordered_map<std::string, const onnx::NodeProto*> producers;
  for (const auto& node : model.graph().node()) {
    for (const auto& output : node.output()) producers[output] = &node;
  }
  for (const auto& node : model.graph().node()) {
    if (node.op_type() != "NonZero" || node.input_size() < 1) continue;
    // The pass reads the mask as Reshape(mask, [-1]) -> NonZero.
    auto reshape = producers.find(node.input(0));
    if (reshape == producers.end() || reshape->second->op_type() != "Reshape") continue;
    std::string value = reshape->second->input(0);
    for (auto it = producers.find(value); it != producers.end() && it->second->op_type() == "Cast";
         it = producers.find(value)) {
      value = it->second->input(0);
    }
    for (const auto& input : model.graph().input()) {
      if (input.name() == value) return value;
    }
  }
  return "";
}

// "name: max abs error 0.3, 2% of elements outside tolerance" for the first failing output.
std::string WorstOutput(const v1::ParityReport& parity) {
  for (const auto& output : parity.outputs()) {
    if (output.passed()) continue;
    if (!output.note().empty()) return absl::StrCat(output.name(), ": ", output.note());
    return absl::StrFormat("%s: %smax abs error %.4g, %.2f%% of elements outside tolerance, cosine %.6f",
                           output.name(), output.nan_or_inf_introduced() ? "NaN/Inf introduced, " : "",
                           output.max_abs_error(), 100 * output.mismatch_fraction(), output.cosine_similarity());
  }
  return "no output failed";
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

}  // namespace

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
  if (!pipeline.ok()) return absl::InvalidArgumentError(absl::StrCat("CONFIG_INVALID: ", pipeline.status().message()));
  absl::Status status = CheckValidationSettings(config.validation());
  if (status.ok()) status = CheckBenchmarkSettings(config.benchmark());
  if (status.ok()) status = CheckPrecisionConfig(config.precision());
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat("CONFIG_INVALID: ", status.message()));
  return absl::OkStatus();
}

absl::Status CheckModel(const onnx::ModelProto& model, std::vector<std::string>* warnings) {
  const int64_t opset = DefaultOpset(model);
  if (opset > kMaxCheckedOpset) {
    warnings->push_back(absl::StrCat("model uses opset ", opset, ", newer than the ", kMaxCheckedOpset,
                                     " onnx 1.12 knows: the ONNX checker was skipped and passes that need shapes "
                                     "leave such graphs alone"));
    return absl::OkStatus();
  }
  EnsureContribSchemas();  // the checker sees the same registry whatever ran before
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("MODEL_CHECK_FAILED: ", e.what()));
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

// The pipeline's initial shapes (InferInitialShapes), inferred on a thread of their own while the
// model is only read. Joined by Take() or when it goes.
class BackgroundShapes {
 public:
  BackgroundShapes(const onnx::ModelProto& model, bool start) {
    if (!start) return;
    thread_ = std::thread([this, &model] {
      try {
        shapes_ = InferInitialShapes(model);
      } catch (const std::exception&) {
        // Nothing handed over: the pipeline infers them itself.
      }
    });
  }
  BackgroundShapes(const BackgroundShapes&) = delete;
  BackgroundShapes& operator=(const BackgroundShapes&) = delete;
  ~BackgroundShapes() {
    if (thread_.joinable()) thread_.join();
  }

  bool started() const { return thread_.joinable(); }
  std::optional<InitialShapes> Take() {
    if (thread_.joinable()) thread_.join();
    return std::move(shapes_);
  }

 private:
  std::optional<InitialShapes> shapes_;
  std::thread thread_;
};

absl::StatusOr<OptimizeResult> Optimize(const OptimizeRequest& request, v1::Report* partial_report) {
  const auto start = std::chrono::steady_clock::now();
  OptimizeResult result;
  v1::Report& report = result.report;
  report.set_optimizer_version(kOptimizerVersion);
  auto fail = [&](absl::Status status) -> absl::Status {
    report.set_total_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    MakeStringsValidUtf8(&report);
    if (partial_report != nullptr) *partial_report = report;
    return status;
  };
  const v1::OptimizationConfig& config = request.config;

  Progress(request, Phase::kLoading);
  absl::Status config_status = CheckConfig(config);
  if (!config_status.ok()) return fail(config_status);
  // Big tensors stay in their files: the original and its optimized copy share them, and the result
  // is written file to file, so a model costs memory for its graph and what passes make.
  absl::StatusOr<onnx::ModelProto> original = LoadModelByReference(request.model_path);
  if (!original.ok()) return fail(original.status());
  // Built before the model is checked (its errors are reported after the check's), so that the shapes
  // the pipeline starts from can be inferred on another thread while this one checks and describes
  // the model: all of it only reads the model, and the inference is 15% of a 100k-node run.
  absl::StatusOr<Pipeline> pipeline = BuildPipeline(config, DefaultPassRegistry(), &*original);
  BackgroundShapes initial_shapes(*original, pipeline.ok() && InfersShapesFirst(*pipeline, {}));
  std::vector<std::string> warnings;
  absl::Status check = CheckModel(*original, &warnings);
  for (auto& warning : warnings) report.add_warnings(std::move(warning));
  if (!check.ok()) return fail(check);
  *report.mutable_original() = Summarize(*original, ModelBytes(*original));
  absl::StatusOr<std::vector<SuppliedSample>> supplied = LoadSuppliedInputs(request.input_files);
  if (!supplied.ok()) return fail(supplied.status());

  Progress(request, Phase::kOptimizing);
  if (!pipeline.ok()) return fail(pipeline.status());
  report.set_pipeline(pipeline->preset);
  // Past the pipeline the original is read by validation, the benchmark and calibration; the report
  // needs only what detection reads from it. Without those the pipeline takes the original itself:
  // copying a 100k-node graph cost 0.13 s and the memory of a second graph.
  const TransformerEvidence original_evidence = ReadTransformerEvidence(*original);
  if (initial_shapes.started()) OrtEnvironment();  // made here, where the inference hides it, not in fold_constants
  std::optional<InitialShapes> shapes = initial_shapes.Take();  // before the model moves
  const bool original_needed =
      !config.validation().skip() || !config.benchmark().skip() || PrecisionRequested(config.precision());
  onnx::ModelProto optimized = original_needed ? *original : std::move(*original);
  if (!original_needed) original = absl::FailedPreconditionError("the original was moved into the pipeline");
  PassManagerOptions options;
  options.cancelled = request.cancelled;
  options.on_pass_start = [&](const std::string& pass, int done, int total) {
    if (request.on_progress) request.on_progress(Phase::kOptimizing, pass, done, total);
  };
  std::vector<v1::PassReport> pass_reports;
  absl::Status passes = RunPipeline(*pipeline, &optimized, options, &pass_reports, std::move(shapes));
  for (const auto& pass_report : pass_reports) *report.add_passes() = pass_report;
  if (!passes.ok()) return fail(passes);
  // Lower precision comes after the pipeline, its runs reported with it but kept apart for the
  // bisection (which replays the pipeline alone).
  const v1::PrecisionConfig& precision = config.precision();
  const bool precision_requested = PrecisionRequested(precision);
  onnx::ModelProto fp32_model;
  std::vector<v1::PassReport> precision_runs;
  PrecisionExtras calibrated;
  if (precision_requested) {
    fp32_model = optimized;
    if (precision.mode() == "int8_static") {
      if (request.on_progress) request.on_progress(Phase::kOptimizing, "calibration", 0, 0);
      SessionSettings cpu;
      cpu.intra_op_threads = config.benchmark().intra_op_threads();
      std::string warning;
      absl::StatusOr<std::map<std::string, ValueRange>> ranges = CalibrateActivations(
          fp32_model, *original, precision, config.validation(), *supplied, cpu, request.cancelled, &warning);
      if (!ranges.ok()) return fail(ranges.status());
      calibrated.activation_ranges = *std::move(ranges);
      if (!warning.empty()) report.add_warnings(warning);
    }
    absl::Status converted = ApplyPrecision(precision, calibrated, options, &optimized, &precision_runs);
    for (const auto& pass_report : precision_runs) *report.add_passes() = pass_report;
    if (!converted.ok()) return fail(converted);
    DescribePrecision(precision, fp32_model, optimized, precision_runs, report.mutable_precision());
  }
  // keep_io_types off: the result reads and writes float16; parity and the benchmark use it behind
  // Casts to the original's interface (the report says so).
  bool interface_changed = precision_requested && precision.has_keep_io_types() && !precision.keep_io_types() &&
                           (precision.mode() == "fp16" || precision.mode() == "bf16");
  if (interface_changed) {
    report.add_warnings("precision.keep_io_types is off: the model's float inputs and outputs are now " +
                        precision.mode() + "; parity and the benchmark ran it behind Casts from and to float32");
  }
  auto InMemory = [](const onnx::ModelProto& model) -> absl::StatusOr<ModelSource> {
    absl::StatusOr<std::string> bytes = SerializeForRuntime(model);
    if (!bytes.ok()) return bytes.status();
    return ModelSource{*std::move(bytes), {}};
  };
  auto InterfaceView = [&](const onnx::ModelProto& model) { return InMemory(WithOriginalInterface(model, *original)); };
  auto all_runs = [&](const std::vector<v1::PassReport>& lower) {
    std::vector<v1::PassReport> runs = pass_reports;
    runs.insert(runs.end(), lower.begin(), lower.end());
    return runs;
  };

  Progress(request, Phase::kSaving);
  if (Cancelled(request)) return fail(absl::CancelledError("cancelled before saving"));
  std::error_code error;
  fs::create_directories(request.output_dir, error);
  if (error) return fail(absl::InternalError(absl::StrCat("cannot create ", request.output_dir.string())));
  const fs::path output_path = request.output_dir / "model.onnx";
  // Writes `model` as the result and describes it in the report.
  auto save_result = [&](const onnx::ModelProto& model, const std::vector<v1::PassReport>& runs) -> absl::Status {
    SaveOptions save;
    save.durable = request.durable_output;
    absl::StatusOr<std::vector<fs::path>> files = SaveModel(model, output_path, save);
    if (!files.ok()) return files.status();
    for (const auto& stale : result.files) {
      if (std::find(files->begin(), files->end(), stale) == files->end()) fs::remove(stale, error);
    }
    result.files = *files;
    int64_t saved_bytes = 0;
    for (const auto& file : result.files) saved_bytes += static_cast<int64_t>(fs::file_size(file, error));
    *report.mutable_optimized() = Summarize(model, saved_bytes);
    report.clear_runtimes();
    for (auto& runtime : Runtimes(report.optimized())) report.add_runtimes(std::move(runtime));
    *report.mutable_transformer() = JudgeTransformerFusion(original_evidence, model, runs, pipeline->hints);
    return absl::OkStatus();
  };
  absl::Status saved = save_result(optimized, all_runs(precision_runs));
  if (!saved.ok()) return fail(saved);

  const bool skip_parity = config.validation().skip();
  const bool skip_benchmark = config.benchmark().skip();
  report.mutable_parity()->set_skipped(skip_parity);
  report.mutable_benchmark()->set_skipped(skip_benchmark);
  if (skip_parity && skip_benchmark) return Finish(start, partial_report, &result);

  // The original as loaded; one with tensors by reference goes by path, ONNX Runtime reading its
  // external data itself.
  const ModelSource original_source = HasTensorsByReference(*original)
                                          ? ModelSource{"", request.model_path}
                                          : ModelSource{original->SerializeAsString(), {}};
  absl::StatusOr<SessionSettings> resolved = DeviceSettings(config, &report);
  if (!resolved.ok()) return fail(resolved.status());
  const SessionSettings device = *resolved;

  bool returned_original = false;
  if (!skip_parity) {
    Progress(request, Phase::kValidating);
    SessionSettings settings = device;
    settings.optimization_level = OrtLevel(config.validation().ort_optimization_level(), ORT_DISABLE_ALL);
    auto original_session = CreateSession(original_source, settings);
    if (!original_session.ok()) return fail(original_session.status());
    v1::ParityReport* parity = report.mutable_parity();
    parity->set_ort_optimization_level(OrtLevelName(settings.optimization_level));
    absl::StatusOr<ParityReference> reference = BuildParityReference(**original_session, *original, config.validation(),
                                                                     *supplied, request.cancelled, parity);
    if (!reference.ok()) return fail(reference.status());
    reference->valid_positions_of = PaddingMaskInput(pass_reports, optimized);
    parity->set_valid_positions_of(reference->valid_positions_of);
    // Judges a candidate in memory (the bisection's probes) or, for the result, from its file.
    // A candidate ONNX Runtime cannot load or run fails parity like one with wrong numbers, so that
    // bisection can find the pass that made it and recover.
    auto judge = [&](const ModelSource& source, const std::string& precision,
                     v1::ParityReport* into) -> absl::StatusOr<bool> {
      auto broken = [&](absl::string_view what, const absl::Status& status) {
        into->clear_outputs();
        into->set_passed(false);
        v1::OutputParity* output = into->add_outputs();
        output->set_name("(model)");
        output->set_note(absl::StrCat(what, status.message()));
        return false;
      };
      auto session = CreateSession(source, settings);
      if (!session.ok()) return broken("the optimized model does not load in ONNX Runtime: ", session.status());
      absl::Status compared = CompareWithReference(**session, precision, *reference, config.validation(),
                                                   request.cancelled, into);
      if (compared.code() == absl::StatusCode::kInternal) return broken("", compared);
      if (!compared.ok()) return compared;
      return into->passed();
    };
    absl::StatusOr<ModelSource> optimized_source = interface_changed ? InterfaceView(optimized) : SourceFor(output_path);
    if (!optimized_source.ok()) return fail(optimized_source.status());
    absl::StatusOr<bool> judged = judge(*optimized_source, ModelPrecision(optimized), parity);
    if (!judged.ok()) return fail(judged.status());
    bool passed = *judged;
    ParityProbe probe = [&](const onnx::ModelProto& candidate, v1::ParityReport* into) -> absl::StatusOr<bool> {
      *into = *parity;
      absl::StatusOr<ModelSource> source = interface_changed ? InterfaceView(candidate) : InMemory(candidate);
      if (!source.ok()) return source.status();
      return judge(*source, ModelPrecision(candidate), into);
    };
    if (!passed && precision_requested) {
      v1::PrecisionReport* described = report.mutable_precision();
      described->set_note(absl::StrCat("the ", precision.mode(), " model failed parity: ", WorstOutput(*parity)));
      if (!precision.has_auto_mixed() || precision.auto_mixed()) {
        if (request.on_progress) request.on_progress(Phase::kValidating, "automatic mixed precision", 0, 0);
        ActivationMagnitudes ranges = [&](const onnx::ModelProto& model) {
          return MaxAbsActivations(model, reference->sets.front().inputs, settings);
        };
        std::string search_failure;
        absl::StatusOr<std::optional<MixedPrecisionResult>> mixed =
            SearchMixedPrecision(fp32_model, precision, calibrated, probe, ranges, options, &search_failure);
        if (!mixed.ok()) return fail(mixed.status());
        if (mixed->has_value()) {
          MixedPrecisionResult& found = **mixed;
          optimized = std::move(found.model);
          precision_runs = std::move(found.runs);
          *parity = found.parity;
          report.clear_passes();
          for (const auto& pass_report : all_runs(precision_runs)) *report.add_passes() = pass_report;
          const std::string first_failure = described->note();
          described->Clear();
          described->set_note(first_failure);
          DescribePrecision(precision, fp32_model, optimized, precision_runs, described);
          described->clear_kept_nodes();
          for (const auto& kept : found.kept) *described->add_kept_nodes() = kept;
          described->set_auto_mixed_attempts(found.attempts);
          report.add_warnings(absl::StrCat(precision.mode(), " alone failed parity; automatic mixed precision kept ",
                                           found.kept.size(), " node(s) in float32 (see precision.kept_nodes)"));
          absl::Status resaved = save_result(optimized, all_runs(precision_runs));
          if (!resaved.ok()) return fail(resaved);
          passed = true;
        } else {
          described->set_note(absl::StrCat(described->note(), "; automatic mixed precision found nothing: ",
                                           search_failure));
        }
      }
      if (!passed) {
        if (config.validation().on_parity_failure() == v1::ON_PARITY_FAILURE_FAIL) {
          return fail(absl::AbortedError(absl::StrCat(
              "PARITY_FAILED: precision mode '", precision.mode(), "' broke parity",
              described->note().empty() ? "" : absl::StrCat(" (", described->note(), ")"),
              "; see the report's parity and precision sections")));
        }
        // Recover: give the lower precision up, keep the float32 pipeline output if it passes.
        described->set_note(absl::StrCat(described->note().empty() ? "" : absl::StrCat(described->note(), "; "),
                                         precision.mode(), " broke parity, so the float32 model is returned"));
        report.add_warnings(absl::StrCat("precision mode '", precision.mode(),
                                         "' broke parity; the returned model stays in float32"));
        optimized = fp32_model;
        interface_changed = false;
        precision_runs.clear();
        report.clear_passes();
        for (const auto& pass_report : pass_reports) *report.add_passes() = pass_report;
        absl::Status resaved = save_result(optimized, pass_reports);
        if (!resaved.ok()) return fail(resaved);
        absl::StatusOr<ModelSource> fp32_source = SourceFor(output_path);
        if (!fp32_source.ok()) return fail(fp32_source.status());
        absl::StatusOr<bool> again = judge(*fp32_source, ModelPrecision(optimized), parity);
        if (!again.ok()) return fail(again.status());
        passed = *again;
      }
    }
    if (!passed) {
      absl::StatusOr<BisectionResult> bisected =
          BisectAndRecover(*original, *pipeline, optimized, pass_reports, probe, request.cancelled);
      if (!bisected.ok()) return fail(bisected.status());
      const std::string culprits = CulpritList(bisected->bisection);
      if (config.validation().on_parity_failure() == v1::ON_PARITY_FAILURE_FAIL) {
        *parity->mutable_bisection() = bisected->bisection;
        return fail(absl::AbortedError(absl::StrCat(
            "PARITY_FAILED: the optimized model's outputs differ from the original's beyond the tolerance",
            culprits.empty() ? "" : absl::StrCat("; the first pass to break parity: ", culprits),
            "; see the report's parity section")));
      }
      // Recover: the best model that passes becomes the result.
      *parity = bisected->parity;
      *parity->mutable_bisection() = bisected->bisection;
      returned_original = bisected->bisection.returned_original();
      report.add_warnings(absl::StrCat("the full pipeline broke parity", culprits.empty() ? "" : absl::StrCat(" (", culprits, ")"),
                                       returned_original ? "; the original model is returned"
                                                         : "; the returned model was optimized without the culprit passes"));
      optimized = std::move(bisected->model);
      report.clear_passes();
      for (const auto& pass_report : bisected->passes) *report.add_passes() = pass_report;
      absl::Status resaved = save_result(optimized, bisected->passes);
      if (!resaved.ok()) return fail(resaved);
    }
    // Dims the pipeline freed: the result at other lengths, which parity at the exported shapes
    // does not see (validation/length_check.h).
    if (!returned_original && !FreedDims(*original, optimized).empty()) {
      if (request.on_progress) request.on_progress(Phase::kValidating, "other lengths", 0, 0);
      absl::StatusOr<ModelSource> source = interface_changed ? InterfaceView(optimized) : SourceFor(output_path);
      if (!source.ok()) return fail(source.status());
      auto optimized_session = CreateSession(*source, settings);
      if (!optimized_session.ok()) return fail(optimized_session.status());
      absl::Status checked = CheckFreedLengths(**original_session, *original, **optimized_session, optimized,
                                               ModelPrecision(optimized), config.validation(), parity);
      if (!checked.ok()) return fail(checked);
      for (const auto& check : parity->lengths()) {
        if (!check.passed()) {
          parity->set_passed(false);
          return fail(absl::AbortedError(absl::StrCat("PARITY_FAILED: with '", check.dim(), "' at ", check.length(),
                                                      " instead of the exported ", check.exported(), ": ",
                                                      check.note())));
        }
        if (!check.note().empty()) {
          report.add_warnings(absl::StrCat("'", check.dim(), "' at ", check.length(), ": ", check.note()));
        }
        if (check.length() < check.exported() && check.compared_outputs_size() == 0) {
          report.add_warnings(absl::StrCat("'", check.dim(), "' at ", check.length(),
                                           ": no output could be compared with the original (their first positions "
                                           "depend on later ones); only the exported length was compared"));
        }
      }
    }
  }

  if (!skip_benchmark) {
    Progress(request, Phase::kBenchmarking);
    std::optional<ModelSource> view;
    if (interface_changed) {
      absl::StatusOr<ModelSource> made = InterfaceView(optimized);
      if (!made.ok()) return fail(made.status());
      view = *std::move(made);
    }
    absl::Status timed = RunBenchmark(request, *original, original_source, optimized, output_path, device, *supplied,
                                      &report, &result, view ? &*view : nullptr);
    if (!timed.ok()) return fail(timed);
    if (report.benchmark().regression()) {
      report.add_warnings(absl::StrFormat(
          "the optimized model is slower than the original beyond the noise (speedup %.3fx, 90%% of side-by-side "
          "runs below %.3fx)%s",
          report.benchmark().speedup(), report.benchmark().speedup_p90(),
          config.benchmark().on_regression() == v1::ON_REGRESSION_RETURN_ORIGINAL ? "; the original model is returned"
                                                                                  : ""));
      if (config.benchmark().on_regression() == v1::ON_REGRESSION_RETURN_ORIGINAL && !returned_original) {
        returned_original = true;
        report.add_warnings(absl::StrCat("the pipeline's output (", report.optimized().nodes(),
                                         " nodes) was slower; the report's model sections describe the returned "
                                         "original, its benchmark section the pipeline's output"));
        absl::Status resaved = save_result(*original, {});  // the report now describes the file returned
        if (!resaved.ok()) return fail(resaved);
        report.mutable_benchmark()->clear_tuning();  // it tuned the model that is not returned
      }
    }
  }
  report.set_returned_original(returned_original);
  if (precision_requested) report.mutable_precision()->set_precision(returned_original ? "fp32" : ModelPrecision(optimized));
  return Finish(start, partial_report, &result);
}

}  // namespace onnxopt
