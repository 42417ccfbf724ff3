// `onnxopt compare ORIGINAL OPTIMIZED`: both models on the same inputs in ONNX Runtime, their outputs
// compared as a job's parity check compares them, then timed side by side as its benchmark times them.
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "client/commands/commands.h"
#include "client/report_format.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/runtime_source.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/generation.h"
#include "optimizer/validation/parity.h"

namespace onnxopt::cli {
namespace {

// A session of `model`, which may hold tensors by reference.
absl::StatusOr<std::unique_ptr<Ort::Session>> SessionOfModel(const onnx::ModelProto& model,
                                                             const SessionSettings& settings) {
  absl::StatusOr<ModelSource> source = RuntimeSource(model);
  if (!source.ok()) return source.status();
  return CreateSession(*source, settings);
}

// Times both models side by side with the benchmark's session settings on `device`, and for a model
// with a key/value cache its generation phases and greedy generation (generation.h).
absl::Status CompareLatency(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                            const v1::OptimizationConfig& config, const SessionSettings& device,
                            const std::vector<SuppliedSample>& supplied, v1::Report* report) {
  const SessionSettings settings = BenchmarkSettings(config, device, report->mutable_benchmark());
  auto a = SessionOfModel(original, settings);
  if (!a.ok()) return a.status();
  auto b = SessionOfModel(optimized, settings);
  if (!b.ok()) return b.status();
  auto inputs = BenchmarkInputs(**a, original, config.validation(), supplied);
  if (!inputs.ok()) return inputs.status();
  const TimingMode mode;  // plain runs on host tensors, as compare has always timed
  absl::Status timed = Benchmark(**a, **b, *inputs, config.benchmark(), RunContext(), report->mutable_benchmark(), mode);
  if (!timed.ok()) return timed;
  return ReportGeneration(**a, **b, {original, config.benchmark(), mode, ExactTokensFor(optimized)}, RunContext(),
                          report);
}

// An adapter checked against the model it is for and loaded by ONNX Runtime.
absl::StatusOr<Ort::LoraAdapter> LoadAdapterFor(const std::string& path, const onnx::ModelProto& model) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  auto parsed = ParseAdapter(*bytes);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status fits = CheckAdapterFitsModel(*parsed, model); !fits.ok()) return fits;
  return LoadLoraAdapter(*bytes);
}

class CompareCommand : public Command {
 public:
  explicit CompareCommand(CLI::App& app)
      : Command(app, "compare",
                "run two models on the same inputs in ONNX Runtime: compare outputs, time them side by side") {
    cli()->add_option("ORIGINAL", original_path_, "the reference model")->required();
    cli()->add_option("OPTIMIZED", optimized_path_, "the model to check")->required();
    AddRunOptions(cli(), &config_);
    AddInputsOption(cli(), &inputs_);
    Bind(cli(), "--adapter", &adapter_, "FILE.onnx_adapter",
         "run OPTIMIZED with this LoRA adapter active (ONNX Runtime's adapter API); parity only, no timing");
    AddJsonFlag(cli(), &json_);
  }

  int Run() override {
    auto config = ConfigFrom(config_);
    if (!config.ok()) return Fail(config.status());
    // Big tensors stay in their files: a multi-GB model is neither held whole nor serialized (RuntimeSource).
    auto original = LoadModelByReference(original_path_);
    if (!original.ok()) return Fail(original.status());
    auto optimized = LoadModelByReference(optimized_path_);
    if (!optimized.ok()) return Fail(optimized.status());
    v1::Report report;
    report.set_job("compare");
    if (absl::Status compared = Compare(*config, *original, *optimized, &report); !compared.ok()) return Fail(compared);
    std::cout << (json_ ? client::ToJson(report) : client::FormatReport(report));
    const bool generation_passed = !report.has_generation() || report.generation().passed();
    return report.parity().passed() && generation_passed ? kOk : kJobFailed;
  }

 private:
  absl::Status Compare(const v1::OptimizationConfig& config, const onnx::ModelProto& original,
                       const onnx::ModelProto& optimized, v1::Report* report) {
    auto device = DeviceSettings(config, report);  // --device cuda runs both there, or says why not
    if (!device.ok()) return device.status();
    auto original_session = SessionOfModel(original, *device);
    if (!original_session.ok()) return original_session.status();
    auto optimized_session = SessionOfModel(optimized, *device);
    if (!optimized_session.ok()) return optimized_session.status();
    auto supplied = SuppliedInputs();
    if (!supplied.ok()) return supplied.status();
    std::optional<Ort::LoraAdapter> adapter;
    Ort::RunOptions adapter_options;
    if (adapter_.given()) {
      auto loaded = LoadAdapterFor(*adapter_, optimized);
      if (!loaded.ok()) return loaded.status();
      adapter = *std::move(loaded);
      adapter_options.AddActiveLoraAdapter(*adapter);
    }
    const ParityPair pair{**original_session, original, **optimized_session, ModelPrecision(optimized),
                          adapter ? &adapter_options : nullptr};
    absl::Status parity = CheckParity(pair, config.validation(), *supplied, RunContext(), report->mutable_parity());
    if (!parity.ok()) return parity;
    if (config.benchmark().skip() || adapter) {  // the timing binds inputs, which adapters do not reach
      report->mutable_benchmark()->set_skipped(true);
      return absl::OkStatus();
    }
    return CompareLatency(original, optimized, config, *device, *supplied, report);
  }

  absl::StatusOr<std::vector<SuppliedSample>> SuppliedInputs() const {
    if (!inputs_.given()) return std::vector<SuppliedSample>();
    auto files = client::FindInputFiles(*inputs_);
    if (!files.ok()) return files.status();
    return LoadSuppliedInputs(*files);
  }

  std::string original_path_, optimized_path_;
  ConfigFlags config_;
  Flag<std::string> inputs_, adapter_;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> NewCompareCommand(CLI::App& app) { return std::make_unique<CompareCommand>(app); }

}  // namespace onnxopt::cli
