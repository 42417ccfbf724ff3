#include "optimizer/optimize.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "onnx/checker.h"
#include "optimizer/graph.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/validator.h"

namespace onnxopt {
namespace fs = std::filesystem;
namespace {

int64_t DefaultOpset(const onnx::ModelProto& model) {
  for (const auto& opset : model.opset_import()) {
    if (opset.domain().empty() || opset.domain() == "ai.onnx") return opset.version();
  }
  return 0;
}

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

}  // namespace

absl::Status CheckConfig(const v1::OptimizationConfig& config) {
  absl::StatusOr<Pipeline> pipeline = BuildPipeline(config, DefaultPassRegistry());
  if (!pipeline.ok()) return absl::InvalidArgumentError(absl::StrCat("CONFIG_INVALID: ", pipeline.status().message()));
  absl::Status status = CheckValidationConfig(config);
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
  for (const auto& tensor : model.graph().initializer()) initializer_bytes += tensor.ByteSizeLong();
  summary.set_initializer_bytes(initializer_bytes);
  summary.set_model_bytes(model_bytes);
  for (const auto& op : OpHistogram(model.graph())) (*summary.mutable_op_histogram())[op.first] = op.second;
  for (const auto& opset : model.opset_import()) {
    (*summary.mutable_opset_imports())[opset.domain().empty() ? "ai.onnx" : opset.domain()] = opset.version();
  }
  return summary;
}

absl::StatusOr<OptimizeResult> Optimize(const OptimizeRequest& request, v1::Report* partial_report) {
  const auto start = std::chrono::steady_clock::now();
  OptimizeResult result;
  v1::Report& report = result.report;
  report.set_optimizer_version(kOptimizerVersion);
  auto fail = [&](absl::Status status) -> absl::Status {
    report.set_total_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (partial_report != nullptr) *partial_report = report;
    return status;
  };

  Progress(request, Phase::kLoading);
  absl::Status config_status = CheckConfig(request.config);
  if (!config_status.ok()) return fail(config_status);
  absl::StatusOr<onnx::ModelProto> original = LoadModel(request.model_path);
  if (!original.ok()) return fail(original.status());
  std::vector<std::string> warnings;
  absl::Status check = CheckModel(*original, &warnings);
  for (auto& warning : warnings) report.add_warnings(std::move(warning));
  if (!check.ok()) return fail(check);
  *report.mutable_original() = Summarize(*original, static_cast<int64_t>(original->ByteSizeLong()));

  Progress(request, Phase::kOptimizing);
  absl::StatusOr<Pipeline> pipeline = BuildPipeline(request.config, DefaultPassRegistry());
  if (!pipeline.ok()) return fail(pipeline.status());
  onnx::ModelProto optimized = *original;
  PassManagerOptions options;
  options.cancelled = request.cancelled;
  options.on_pass_start = [&](const std::string& pass, int done, int total) {
    if (request.on_progress) request.on_progress(Phase::kOptimizing, pass, done, total);
  };
  std::vector<v1::PassReport> pass_reports;
  absl::Status passes = RunPipeline(*pipeline, &optimized, options, &pass_reports);
  for (auto& pass_report : pass_reports) *report.add_passes() = std::move(pass_report);
  if (!passes.ok()) return fail(passes);

  Progress(request, Phase::kSaving);
  if (Cancelled(request)) return fail(absl::CancelledError("cancelled before saving"));
  std::error_code error;
  fs::create_directories(request.output_dir, error);
  if (error) return fail(absl::InternalError(absl::StrCat("cannot create ", request.output_dir.string())));
  const fs::path output_path = request.output_dir / "model.onnx";
  absl::StatusOr<std::vector<fs::path>> files = SaveModel(optimized, output_path);
  if (!files.ok()) return fail(files.status());
  result.files = *files;
  int64_t saved_bytes = 0;
  for (const auto& file : result.files) saved_bytes += static_cast<int64_t>(fs::file_size(file, error));
  *report.mutable_optimized() = Summarize(optimized, saved_bytes);
  for (auto& runtime : Runtimes(report.optimized())) report.add_runtimes(std::move(runtime));

  const bool skip_parity = request.config.validation().skip();
  const bool skip_benchmark = request.config.benchmark().skip();
  report.mutable_parity()->set_skipped(skip_parity);
  report.mutable_benchmark()->set_skipped(skip_benchmark);
  if (!skip_parity || !skip_benchmark) {
    Progress(request, Phase::kValidating);
    // The original as loaded (external data pulled in); a model too big for memory goes by path.
    absl::StatusOr<ModelSource> original_source =
        original->ByteSizeLong() < (size_t{1} << 30) ? absl::StatusOr<ModelSource>(ModelSource{original->SerializeAsString(), {}})
                                                     : SourceFor(request.model_path);
    if (!original_source.ok()) return fail(original_source.status());
    absl::StatusOr<ModelSource> optimized_source = SourceFor(output_path);
    if (!optimized_source.ok()) return fail(optimized_source.status());
    SessionSettings settings;
    settings.device = request.config.benchmark().device() == v1::DEVICE_CUDA ? v1::DEVICE_CUDA : v1::DEVICE_CPU;
    settings.intra_op_threads = request.config.benchmark().intra_op_threads();
    auto original_session = CreateSession(*original_source, settings);
    if (!original_session.ok()) return fail(original_session.status());
    auto optimized_session = CreateSession(*optimized_source, settings);
    if (!optimized_session.ok()) {
      return fail(absl::InternalError(absl::StrCat("the optimized model does not load in ONNX Runtime: ",
                                                   optimized_session.status().message())));
    }
    if (!skip_parity) {
      absl::Status parity = CheckParity(**original_session, **optimized_session, *original,
                                        request.config.validation(), request.cancelled, report.mutable_parity());
      if (!parity.ok()) return fail(parity);
      if (!report.parity().passed()) {
        return fail(absl::AbortedError("PARITY_FAILED: the optimized model's outputs differ from the original's "
                                       "beyond the tolerance; see the report's parity section"));
      }
    }
    if (!skip_benchmark) {
      Progress(request, Phase::kBenchmarking);
      v1::BenchmarkReport* benchmark = report.mutable_benchmark();
      benchmark->set_device(settings.device == v1::DEVICE_CUDA ? "CUDA GPU" : CpuDescription());
      benchmark->set_execution_provider(*ProviderFor(settings.device));
      absl::Status timed = Benchmark(**original_session, **optimized_session, *original, request.config,
                                     request.cancelled, benchmark);
      if (!timed.ok()) return fail(timed);
    }
  }
  report.set_total_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (partial_report != nullptr) *partial_report = report;
  return result;
}

}  // namespace onnxopt
