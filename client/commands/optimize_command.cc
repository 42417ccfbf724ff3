// `onnxopt optimize MODEL -o OUT`: the pipeline and its validation in this process, as a job runs
// them in a worker (onnxopt::Optimize), with the result delivered as a job's would be.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/commands/commands.h"
#include "client/commands/delivery.h"
#include "client/commands/progress_line.h"
#include "client/report_format.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/result_files.h"

namespace onnxopt::cli {
namespace fs = std::filesystem;
namespace {

// The progress line's text for an optimizer callback.
std::string PhaseText(Phase phase, const std::string& step, int done, int total) {
  static constexpr const char* kPhaseNames[] = {"loading", "optimizing", "saving", "validating", "benchmarking"};
  const std::string phase_name = kPhaseNames[static_cast<int>(phase)];
  return total > 0 ? absl::StrCat(phase_name, "  pass ", done + 1, "/", total, " ", step)
                   : absl::StrCat(phase_name, step.empty() ? "" : "  ", step);
}

class OptimizeCommand : public Command {
 public:
  explicit OptimizeCommand(CLI::App& app)
      : Command(app, "optimize", "run the pipeline and validation locally, no server") {
    cli()->add_option("MODEL", model_, "the .onnx file")->required();
    AddOutOption(cli(), &out_, "OUT.onnx", "the optimized model (and OUT.report.json), or the repository with --layout")
        ->required();
    AddConfigOptions(cli(), &config_);
    AddInputsOption(cli(), &inputs_);
    AddJsonFlag(cli(), &json_);
    Bind(cli(), "--html", &html_, "FILE", "also write the report as one HTML page");
    AddRepositoryOptions(cli(), &repository_);
  }

  int Run() override {
    auto config = ConfigFrom(config_);
    if (!config.ok()) return Fail(config.status());
    auto repository = RepositoryFrom(repository_, out_);
    if (!repository.ok()) return Fail(repository.status());
    if (*repository) {
      if (absl::Status fits = client::CheckModelFitsLayout(model_, **repository); !fits.ok()) return Fail(fits);
    }
    const Destination to{*out_, *repository};
    v1::Report report;
    auto delivered = OptimizeAndDeliver(*config, to, &report);
    // A model that never loaded has no report to show: only the error (a parser must not take an empty
    // report for a result).
    if (!delivered.ok() && !report.has_original()) return Fail(delivered.status());
    std::cout << (json_ ? client::ToJson(report) : client::FormatReport(report));
    if (html_.given()) {
      if (absl::Status written = WriteHtml(report, *html_); !written.ok()) return Fail(written);
    }
    if (!delivered.ok()) return Fail(delivered.status());
    if (!json_) PrintDelivered(to, *delivered);
    return kOk;
  }

 private:
  // Runs the optimizer into a staging folder in WorkFolder(to) and delivers what it made with the
  // report, as a job's files are.
  absl::StatusOr<Delivered> OptimizeAndDeliver(const v1::OptimizationConfig& config, const Destination& to,
                                               v1::Report* report) {
    const fs::path work = WorkFolder(to);
    std::error_code error;
    fs::create_directories(work, error);
    const fs::path staging = work / (".onnxopt-" + std::to_string(::getpid()));
    auto result = OptimizeInto(config, staging, report);
    if (result.ok()) {
      // The data file is named after the output, as the model now says; the report goes beside it (or
      // into the repository), as a job's does.
      std::vector<fs::path> made = result->files;
      made.push_back(staging / kReportFileName);
      absl::Status written = WriteFileAtomically(made.back(), client::ToJson(*report));
      auto moved = written.ok() ? Deliver(client::LocalResultFiles(made), *report, to)
                                : absl::StatusOr<Delivered>(written);
      fs::remove_all(staging, error);
      return moved;
    }
    fs::remove_all(staging, error);
    return result.status();
  }

  absl::StatusOr<OptimizeResult> OptimizeInto(const v1::OptimizationConfig& config, const fs::path& staging,
                                              v1::Report* report) {
    OptimizeRequest request;
    request.model_path = model_;
    request.output_dir = staging;
    request.config = config;
    request.durable_output = false;  // a local file, like cp's: the kernel writes it back (no fsync)
    if (inputs_.given()) {
      auto files = client::FindInputFiles(*inputs_);
      if (!files.ok()) return files.status();
      request.input_files = *std::move(files);
    }
    ProgressLine line;
    request.on_progress = [&](Phase phase, const std::string& step, int done, int total) {
      line.Show(PhaseText(phase, step, done, total));
    };
    return Optimize(request, report);
  }

  std::string model_;
  Flag<std::string> out_, inputs_, html_;
  ConfigFlags config_;
  RepositoryFlags repository_;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> NewOptimizeCommand(CLI::App& app) { return std::make_unique<OptimizeCommand>(app); }

}  // namespace onnxopt::cli
