// The job's last stage: the returned model takes the form it is delivered in.
//
// - Adapters extract_adapters took out of the graph leave it first: the values of the adapter inputs'
//   defaults go to model.onnx_adapter, empty defaults stay (no adapter: the base model). Validation and
//   the benchmark ran with the values as defaults, which is what ONNX Runtime's adapter API does too
//   (an active adapter's parameters are feeds); here the pair is checked once more through that API,
//   on the validated interface, since a file that names or shapes a parameter wrongly fails only there.
// - Then passes_after (packaging: pre/post-processing put into the model). They change its interface,
//   so they come after validation and the benchmark, which compare and time the model the pipeline made
//   against the original on the original's inputs; their own correctness is their tests' (against
//   reference pipelines).
// - Last the lineage (model_lineage.h): producer and metadata_props, with the verdict and the speedup.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "optimizer/failure.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/model_lineage.h"
#include "optimizer/optimize_job.h"
#include "optimizer/precision.h"
#include "optimizer/sha256.h"
#include "optimizer/validation/parity.h"

namespace onnxopt {

namespace fs = std::filesystem;

absl::Status OptimizeJob::Deliver() {
  onnx::ModelProto* returned = validation_.returned_original ? &*loaded_.original : &rewritten_.optimized;
  // The adapter first, checked on the model validation compared (the original's interface).
  std::vector<onnx::TensorProto> adapter = TakeAdapterDefaults(returned);
  std::optional<std::string> adapter_bytes;
  if (!adapter.empty()) {
    Progress(Phase::kSaving, "adapter");
    absl::StatusOr<std::string> bytes = SerializeAdapter(adapter);
    if (!bytes.ok()) return bytes.status();
    v1::AdapterReport* described = report_.mutable_adapter();
    described->set_file(kAdapterFileName);
    described->set_parameters(static_cast<int64_t>(adapter.size()));
    described->set_bytes(static_cast<int64_t>(bytes->size()));
    for (const onnx::TensorProto& parameter : adapter) {
      char which = 0;
      std::string module;
      if (ParseAdapterParameterName(parameter.name(), &which, &module) && which == 'A') described->add_modules(module);
    }
    if (absl::Status checked = CheckAdapter(*returned, *bytes, described); !checked.ok()) return checked;
    adapter_bytes = *std::move(bytes);
  }
  std::vector<v1::PassReport> runs;
  if (config_.passes_after_size() > 0) {
    Progress(Phase::kSaving, "passes_after");
    Pipeline after;
    absl::StatusOr<std::vector<PipelineStep>> steps = PassListSteps(config_.passes_after(), DefaultPassRegistry());
    if (!steps.ok()) return steps.status();  // BuildPipeline checked them: not expected
    after.steps = *std::move(steps);
    after.hints = loaded_.pipeline->hints;
    absl::Status ran = RunPipeline(after, returned, PassOptions(), &runs);
    for (const auto& run : runs) *report_.add_passes() = run;
    if (!ran.ok()) return ran;
  }
  if (absl::Status saved = runs.empty() && !adapter_bytes ? absl::OkStatus() : SaveDelivered(*returned, runs, adapter_bytes);
      !saved.ok()) {
    return saved;
  }
  // Last, when the verdict and the speedup are known: only the .onnx file is rewritten.
  absl::StatusOr<std::string> source_sha256 = Sha256OfFile(request_.model_path);
  if (!source_sha256.ok()) return source_sha256.status();
  report_.set_returned_original(validation_.returned_original);  // what the lineage says of the file returned
  return StampLineageFile(LineageProps(report_, config_, request_.job_name, *source_sha256, loaded_.source_producer),
                          saved_.output_path);
}

absl::Status OptimizeJob::SaveDelivered(const onnx::ModelProto& returned, const std::vector<v1::PassReport>& runs,
                                        const std::optional<std::string>& adapter_bytes) {
  if (adapter_bytes) {
    const fs::path path = saved_.output_path.parent_path() / kAdapterFileName;
    if (absl::Status written = WriteFileAtomically(path, *adapter_bytes); !written.ok()) return written;
    result_.files.push_back(path);
  }
  std::vector<v1::PassReport> all_runs =
      validation_.returned_original ? std::vector<v1::PassReport>() : AllRuns(rewritten_.precision_runs);
  all_runs.insert(all_runs.end(), runs.begin(), runs.end());
  return SaveResult(returned, all_runs);
}

absl::Status OptimizeJob::CheckAdapter(const onnx::ModelProto& model, const std::string& adapter,
                                       v1::AdapterReport* report) {
  absl::StatusOr<Ort::LoraAdapter> lora = LoadLoraAdapter(adapter);  // ONNX Runtime reads it, validation or not
  if (!lora.ok()) return lora.status();
  v1::ParityReport* parity = report->mutable_parity();
  if (!validation_.reference || validation_.reference->sets.empty()) {
    parity->set_skipped(true);
    return absl::OkStatus();
  }
  absl::StatusOr<ModelSource> source = SourceOf(model, /*saved=*/false);
  if (!source.ok()) return source.status();
  absl::StatusOr<std::unique_ptr<Ort::Session>> session = CreateSession(*source, validation_.parity_settings);
  if (!session.ok()) return session.status();
  Ort::RunOptions with_adapter;
  with_adapter.AddActiveLoraAdapter(*lora);
  absl::Status compared = CompareWithReference(**session, ModelPrecision(model), *validation_.reference,
                                               config_.validation(), request_.run, parity, &with_adapter);
  if (!compared.ok()) return compared;
  if (!parity->passed()) {
    return Failure(absl::StatusCode::kAborted, v1::ErrorReason::PARITY_FAILED,
                   "the returned model with its extracted adapter active does not match the original");
  }
  // No adapter: the base model, defined by the empty defaults; how far it lies from the original (which
  // the adapted model matches).
  const ParityReference::InputSet& first = validation_.reference->sets.front();
  absl::StatusOr<std::vector<Ort::Value>> base =
      RunOnInputs(**session, first.inputs, validation_.reference->output_names);
  if (!base.ok()) {
    return absl::InternalError(
        absl::StrCat("ONNX Runtime cannot run the model without an adapter: ", base.status().message()));
  }
  double largest = 0;
  for (size_t i = 0; i < base->size() && i < first.expected.size(); ++i) {
    v1::OutputParity measured;  // the distance only, as MeasureDeviceDeviation takes it
    CompareOutput(first.expected[i], (*base)[i], 0, 0, &measured);
    largest = std::max(largest, measured.max_abs_error());
  }
  report->set_base_max_abs_diff(largest);
  return absl::OkStatus();
}

}  // namespace onnxopt
