// `onnxopt adapters convert CHECKPOINT... --model M -o OUT`: peft checkpoints as one adapter of the
// model (their sum), which ONNX Runtime must load before it is written.
#include <iostream>
#include <vector>

#include "client/commands/commands.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/peft_adapter.h"

namespace onnxopt::cli {
namespace {

class AdaptersCommand : public Command {
 public:
  explicit AdaptersCommand(CLI::App& app)
      : Command(app, "adapters", "LoRA adapters for models optimized with extract_adapters") {
    cli()->add_option("ACTION", action_, "convert: a peft checkpoint into an .onnx_adapter")
        ->required()
        ->check(CLI::IsMember({"convert"}));
    cli()->add_option("CHECKPOINTS", checkpoints_,
                      "peft folders (adapter_config.json, adapter_model.safetensors); several: one adapter that adds "
                      "them (their ranks concatenated)")
        ->required();
    cli()->add_option("--model", model_, "the optimized model the adapter is for (names and shapes are checked)")
        ->type_name("MODEL.onnx")
        ->required();
    cli()->add_option("-o", out_, "where to write the adapter")->type_name("OUT.onnx_adapter")->required();
  }

  int Run() override {
    auto model = LoadModelByReference(model_);
    if (!model.ok()) return Fail(model.status());
    std::vector<std::string> notes;
    std::vector<std::vector<onnx::TensorProto>> adapters;
    for (const std::string& checkpoint : checkpoints_) {
      auto converted = ConvertPeftCheckpoint(checkpoint, *model, &notes);
      if (!converted.ok()) return Fail(converted.status());
      adapters.push_back(*std::move(converted));
    }
    auto parameters = ConcatenateAdapters(adapters);
    if (!parameters.ok()) return Fail(parameters.status());
    if (absl::Status fits = CheckAdapterFitsModel(*parameters, *model); !fits.ok()) return Fail(fits);
    auto bytes = SerializeAdapter(*parameters);
    if (!bytes.ok()) return Fail(bytes.status());
    if (auto loaded = LoadLoraAdapter(*bytes); !loaded.ok()) return Fail(loaded.status());
    if (absl::Status written = WriteFileAtomically(out_, *bytes); !written.ok()) return Fail(written);
    for (const std::string& note : notes) std::cerr << "onnxopt: note: " << note << "\n";
    std::cout << "adapter: " << out_ << " (" << parameters->size() / 2 << " modules, " << bytes->size() << " bytes)"
              << std::endl;
    return kOk;
  }

 private:
  std::string action_, model_, out_;
  std::vector<std::string> checkpoints_;
};

}  // namespace

std::unique_ptr<Command> NewAdaptersCommand(CLI::App& app) { return std::make_unique<AdaptersCommand>(app); }

}  // namespace onnxopt::cli
