// onnxopt: the command-line client of onnxopt-server, plus local `optimize` and `compare`.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "client/tracking_format.h"
#include "client/model_repository.h"
#include "client/report_format.h"
#include "client/report_html.h"
#include "optimizer/result_files.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/peft_adapter.h"
#include "optimizer/optimize.h"
#include "optimizer/pass_catalog.h"
#include "optimizer/pass_registry.h"
#include "optimizer/runtime_source.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/parity.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/generation.h"

using onnxopt::client::FindRole;
using onnxopt::client::ResultFile;
namespace fs = std::filesystem;
using onnxopt::client::Client;

namespace {

// Exit codes scripts can rely on.
enum ExitCode : int {
  kOk = 0,
  kJobFailed = 1,     // the job (or a local optimize/compare) failed, e.g. parity
  kUsage = 2,         // bad command line
  kServerError = 3,   // unreachable server or a server-side error (UNAVAILABLE, INTERNAL, RESOURCE_EXHAUSTED...)
  kCancelled = 4,     // the job was cancelled
  kRejected = 5,      // the input was refused (INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS, FAILED_PRECONDITION)
};


struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // "--config" -> value; flags -> ""
  std::vector<std::string> dims;               // every --dim, in order
  std::vector<std::string> labels;             // every --label, in order
  bool Has(const std::string& name) const { return options.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = options.find(name);
    return it == options.end() ? fallback : it->second;
  }
};

int ExitFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return kOk;
    case absl::StatusCode::kCancelled: return kCancelled;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists: return kRejected;
    case absl::StatusCode::kAborted: return kJobFailed;
    default: return kServerError;
  }
}

int Report(const absl::Status& status) {
  std::cerr << "onnxopt: " << absl::StatusCodeToString(status.code()) << ": " << status.message() << std::endl;
  return ExitFor(status);
}

absl::Status WriteHtml(const onnxopt::v1::Report& report, const fs::path& path) {
  if (path.empty()) return absl::InvalidArgumentError("--html needs a file name");
  return onnxopt::WriteFileAtomically(path, onnxopt::client::RenderReportHtml(report));
}

int ExitForJob(const onnxopt::v1::Job& job) {
  switch (job.state()) {
    case onnxopt::v1::SUCCEEDED: return kOk;
    case onnxopt::v1::CANCELLED: return kCancelled;
    default: return kJobFailed;
  }
}

// --device: cpu or cuda (gpu), any case.
std::optional<onnxopt::v1::Device> ParseDevice(const std::string& name) {
  const std::string device = absl::AsciiStrToLower(name);
  if (device == "cpu") return onnxopt::v1::DEVICE_CPU;
  if (device == "cuda" || device == "gpu") return onnxopt::v1::DEVICE_CUDA;
  return std::nullopt;
}

// --dim: NAME=N with N >= 0 (0: an empty dim, such as a decoder's past before its first step).
constexpr char kDimUsage[] = "use NAME=N with N >= 0";
std::optional<std::pair<std::string, int64_t>> ParseDim(const std::string& dim) {
  const size_t equals = dim.find('=');
  int64_t value = 0;
  if (equals == std::string::npos || equals == 0 || !absl::SimpleAtoi(dim.substr(equals + 1), &value) || value < 0) {
    return std::nullopt;
  }
  return std::make_pair(dim.substr(0, equals), value);
}

// --label: KEY=VALUE (the server checks the key's characters and the lengths).
std::optional<std::pair<std::string, std::string>> ParseLabel(const std::string& label) {
  const size_t equals = label.find('=');
  if (equals == std::string::npos || equals == 0) return std::nullopt;
  return std::make_pair(label.substr(0, equals), label.substr(equals + 1));
}

std::map<std::string, std::string> LabelsFrom(const Args& args) {
  std::map<std::string, std::string> labels;
  for (const std::string& label : args.labels) {
    if (auto parsed = ParseLabel(label)) labels[parsed->first] = parsed->second;
  }
  return labels;
}

// --layout, --model-name, --version, --max-batch-size, --storage-uri (triton, kserve), --tokenizer,
// --context-length, --genai-type (genai): a model repository or folder at -o instead of a file (nullopt
// without --layout). Checked, the version's folder included, before anything runs.
absl::StatusOr<std::optional<onnxopt::client::RepositoryOptions>> RepositoryFrom(const Args& args) {
  using onnxopt::client::RepositoryLayout;
  const char* const triton_flags[] = {"--model-name", "--version", "--max-batch-size", "--storage-uri"};
  const char* const genai_flags[] = {"--tokenizer", "--context-length", "--genai-type"};
  if (!args.Has("--layout")) {
    for (const char* flag : triton_flags) {
      if (args.Has(flag)) return absl::InvalidArgumentError(absl::StrCat(flag, " needs --layout triton or kserve"));
    }
    for (const char* flag : genai_flags) {
      if (args.Has(flag)) return absl::InvalidArgumentError(absl::StrCat(flag, " needs --layout genai"));
    }
    return std::nullopt;
  }
  auto layout = onnxopt::client::ParseRepositoryLayout(args.Get("--layout"));
  if (!layout.ok()) return layout.status();
  onnxopt::client::RepositoryOptions options;
  options.layout = *layout;
  if (options.layout == RepositoryLayout::kGenai) {
    for (const char* flag : triton_flags) {
      if (args.Has(flag)) return absl::InvalidArgumentError(absl::StrCat(flag, " is for --layout triton or kserve"));
    }
    options.genai.tokenizer_dir = args.Get("--tokenizer");
    options.genai.model_type = args.Get("--genai-type");
    if (args.Has("--context-length") &&
        (!absl::SimpleAtoi(args.Get("--context-length"), &options.genai.context_length) ||
         options.genai.context_length < 1)) {
      return absl::InvalidArgumentError("--context-length needs a number of 1 or more");
    }
  } else {
    for (const char* flag : genai_flags) {
      if (args.Has(flag)) return absl::InvalidArgumentError(absl::StrCat(flag, " is for --layout genai"));
    }
    options.model_name = args.Get("--model-name");
    if (options.model_name.empty()) return absl::InvalidArgumentError("--layout needs --model-name");
    if (args.Has("--version") && !absl::SimpleAtoi(args.Get("--version"), &options.version)) {
      return absl::InvalidArgumentError("--version needs a number");
    }
    if (args.Has("--max-batch-size") && !absl::SimpleAtoi(args.Get("--max-batch-size"), &options.max_batch_size)) {
      return absl::InvalidArgumentError("--max-batch-size needs a number");
    }
    options.storage_uri = args.Get("--storage-uri");
    if (!options.storage_uri.empty() && options.layout != RepositoryLayout::kKServe) {
      return absl::InvalidArgumentError("--storage-uri is for --layout kserve");
    }
  }
  if (absl::Status valid = onnxopt::client::CheckRepositoryOptions(options); !valid.ok()) return valid;
  if (!args.Has("-o")) return absl::InvalidArgumentError("--layout needs -o REPOSITORY");
  if (absl::Status free = onnxopt::client::CheckVersionFree(options, args.Get("-o")); !free.ok()) return free;
  return std::optional<onnxopt::client::RepositoryOptions>(options);
}

// The config file (or the defaults) with --preset, --precision, --device and --dim applied over it.
absl::StatusOr<onnxopt::v1::OptimizationConfig> ConfigFrom(const Args& args) {
  onnxopt::v1::OptimizationConfig config;
  if (args.Has("--config")) {
    auto loaded = onnxopt::client::LoadConfigFile(args.Get("--config"));
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
  }
  if (args.Has("--preset")) {
    if (args.Get("--preset").empty()) return absl::InvalidArgumentError("--preset needs a name");
    config.set_preset(args.Get("--preset"));
    config.clear_passes();  // the flag wins over a pass list in the file
  }
  if (args.Has("--precision")) config.mutable_precision()->set_mode(args.Get("--precision"));
  if (args.Has("--calibration")) config.mutable_precision()->mutable_calibration()->set_method(args.Get("--calibration"));
  if (args.Has("--device")) {
    const std::optional<onnxopt::v1::Device> device = ParseDevice(args.Get("--device"));
    if (!device) return absl::InvalidArgumentError(absl::StrCat("--device ", args.Get("--device"), ": use cpu or cuda"));
    config.mutable_benchmark()->set_device(*device);
  }
  for (const std::string& dim : args.dims) {
    const auto parsed = ParseDim(dim);
    if (!parsed) return absl::InvalidArgumentError(absl::StrCat("--dim ", dim, ": ", kDimUsage));
    (*config.mutable_validation()->mutable_dim_values())[parsed->first] = parsed->second;
  }
  return config;
}

// A status line that rewrites itself on a terminal and prints one line per change otherwise.
class ProgressLine {
 public:
  ProgressLine() : tty_(isatty(STDERR_FILENO)) {}
  ~ProgressLine() { Done(); }
  void Show(const std::string& text) {
    if (text == last_) return;
    last_ = text;
    if (tty_) {
      std::cerr << "\r\033[K" << text << std::flush;
      open_ = true;
    } else {
      std::cerr << text << std::endl;
    }
  }
  void Done() {
    if (open_) std::cerr << std::endl;
    open_ = false;
  }

 private:
  bool tty_;
  bool open_ = false;
  std::string last_;
};

// Renames a result's files from where they were made to where their roles put them: the model to
// `out`, its data file to OUT.data (the model rewritten to say so), an extracted adapter to
// OUT-without-extension.onnx_adapter so that results in one folder do not clash, other files beside
// `out` under their own names.
absl::Status MoveResult(const std::vector<ResultFile>& files, const fs::path& out) {
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const std::string data_name = out.filename().string() + ".data";
  const ResultFile* data = FindRole(files, onnxopt::v1::ARTIFACT_MODEL_DATA);
  std::error_code error;
  for (const ResultFile& file : files) {
    switch (file.role) {
      case onnxopt::v1::ARTIFACT_MODEL:
        if (data != nullptr) {
          absl::Status relocated =
              onnxopt::RelocateExternalData(file.path, data->path.filename().string(), data_name);
          if (!relocated.ok()) return relocated;
        }
        fs::rename(file.path, out, error);
        break;
      case onnxopt::v1::ARTIFACT_MODEL_DATA:
        fs::rename(file.path, dir / data_name, error);
        break;
      case onnxopt::v1::ARTIFACT_ADAPTER:  // OUT.onnx_adapter, as ONNX Runtime GenAI names them
        fs::rename(file.path, dir / (out.stem().string() + ".onnx_adapter"), error);
        break;
      default:
        fs::rename(file.path, dir / file.path.filename(), error);
    }
    if (error) return absl::InternalError(absl::StrCat("cannot move ", file.path.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

// What the first line after a delivery names: the model file, the repository or the GenAI folder.
const char* DeliveredLabel(const std::optional<onnxopt::client::RepositoryOptions>& repository) {
  if (!repository) return "optimized model: ";
  return repository->layout == onnxopt::client::RepositoryLayout::kGenai ? "genai folder:    " : "model repository: ";
}

// Where a result is delivered: a model file (`out`, its data file and report beside it) or, with a
// layout, a model repository at `out`.
struct Destination {
  fs::path out;
  std::optional<onnxopt::client::RepositoryOptions> repository;
};

// Moves a finished result's files (model.onnx, its data, report.json, ...) to `to`: OUT and beside it
// (OUT.report.json), or into the model repository. Returns what to print: the model (or the
// repository) and the report.
absl::StatusOr<std::pair<fs::path, fs::path>> Deliver(std::vector<ResultFile> files, const onnxopt::v1::Report& report,
                                                      const Destination& to) {
  if (to.repository) {
    std::vector<std::string> notes;
    auto written = onnxopt::client::WriteModelRepository(files, report, *to.repository, to.out, &notes);
    if (!written.ok()) return written.status();
    for (const std::string& note : notes) std::cerr << "genai_config.json: " << note << std::endl;
    if (to.repository->layout == onnxopt::client::RepositoryLayout::kGenai) {
      return std::make_pair(to.out, to.out / "onnxopt_report.json");
    }
    return std::make_pair(to.out, to.out / to.repository->model_name / "onnxopt_report.json");
  }
  fs::path report_path = to.out;
  report_path += ".report.json";
  auto report_file = std::find_if(files.begin(), files.end(),
                                  [](const ResultFile& f) { return f.role == onnxopt::v1::ARTIFACT_REPORT; });
  if (report_file != files.end()) {
    std::error_code error;
    fs::rename(report_file->path, report_path, error);
    if (error) return absl::InternalError(absl::StrCat("cannot write ", report_path.string(), ": ", error.message()));
    files.erase(report_file);
  }
  if (absl::Status moved = MoveResult(files, to.out); !moved.ok()) return moved;
  return std::make_pair(to.out, report_path);
}

// Downloads every artifact of the job and delivers them to `to`. The files gather in a folder named
// after the job beside the destination, each resumable (Client::Download), so an interrupted run's
// bytes are not fetched again; the folder goes once everything is delivered.
absl::StatusOr<std::pair<fs::path, fs::path>> DownloadResult(Client& client, const onnxopt::v1::Job& job,
                                                             const Destination& to) {
  // A repository gathers them inside; a file, and a GenAI folder (which appears whole), beside.
  const bool inside = to.repository && to.repository->layout != onnxopt::client::RepositoryLayout::kGenai;
  const fs::path dir = inside ? to.out : (to.out.has_parent_path() ? to.out.parent_path() : fs::path("."));
  std::error_code error;
  fs::create_directories(dir, error);
  const fs::path staging = dir / absl::StrCat(".onnxopt-download-", absl::StripPrefix(job.name(), "jobs/"));
  fs::create_directories(staging, error);
  std::vector<ResultFile> files;
  for (const auto& artifact : job.result().artifacts()) {
    files.push_back({staging / artifact.name(), artifact.role()});
    ProgressLine line;
    absl::Status status = client.Download(job.name(), artifact.name(), files.back().path, [&](int64_t done, int64_t total) {
      if (total >= (int64_t{16} << 20)) {
        line.Show(absl::StrFormat("downloading %s %.1f / %.1f MiB", artifact.name(), done / 1048576.0, total / 1048576.0));
      }
    });
    if (!status.ok()) return status;
  }
  auto report = client.GetReport(job.name());
  if (!report.ok()) return report.status();
  // Everything is here: whatever Deliver makes of it, nothing is left to resume.
  auto delivered = Deliver(files, *report, to);
  fs::remove_all(staging, error);
  return delivered;
}

// Waits for the job and downloads its result to `out`. With `json`: the final job, then its report.
int Follow(Client& client, const std::string& name, const Destination& out, bool json) {
  ProgressLine line;
  auto final_job = client.WatchJob(name, [&](const onnxopt::v1::Job& job) {
    line.Show(absl::StrCat(name, "  ", onnxopt::client::FormatProgressLine(job)));
  });
  line.Done();
  if (!final_job.ok()) return Report(final_job.status());
  if (final_job->state() != onnxopt::v1::SUCCEEDED) {
    if (json) {
      std::cout << onnxopt::client::JobAndReportJson(*final_job, nullptr);
    } else {
      std::cerr << onnxopt::client::FormatJob(*final_job);
    }
    return ExitForJob(*final_job);
  }
  auto downloaded = DownloadResult(client, *final_job, out);
  if (!downloaded.ok()) return Report(downloaded.status());
  if (json) {
    auto report = client.GetReport(name);
    if (!report.ok()) return Report(report.status());
    std::cout << onnxopt::client::JobAndReportJson(*final_job, &*report);
    return kOk;
  }
  const auto& result = final_job->result();
  std::cout << DeliveredLabel(out.repository) << downloaded->first.string() << "\n"
            << "report:          " << downloaded->second.string() << "\n"
            << absl::StrFormat("nodes %d -> %d, parity %s, speedup %.3fx", result.nodes_before(), result.nodes_after(),
                               result.parity_passed() ? "passed" : "not checked", result.speedup())
            << std::endl;
  return kOk;
}

// How many times the same request (its default request id) may be run again after failing.
constexpr int kMaxResubmissions = 100;

int Submit(Client& client, const Args& args) {
  if (args.positional.size() != 2) return (std::cerr << "usage: onnxopt submit MODEL [options]\n", kUsage);
  const fs::path model = args.positional[1];
  auto config = ConfigFrom(args);
  if (!config.ok()) return Report(config.status());
  auto repository = RepositoryFrom(args);  // checked before anything is uploaded
  if (!repository.ok()) return Report(repository.status());
  if (*repository) {
    if (absl::Status fits = onnxopt::client::CheckModelFitsLayout(model, **repository); !fits.ok()) return Report(fits);
  }
  ProgressLine line;
  auto reference = client.UploadModel(model, [&](int64_t done, int64_t total) {
    line.Show(absl::StrFormat("uploading %.1f / %.1f MiB", done / 1048576.0, total / 1048576.0));
  });
  line.Done();
  if (!reference.ok()) return Report(reference.status());
  std::vector<onnxopt::v1::InputTensor> inputs;
  if (args.Has("--inputs")) {
    auto uploaded = client.UploadInputs(args.Get("--inputs"));
    if (!uploaded.ok()) return Report(uploaded.status());
    inputs = *std::move(uploaded);
  }
  onnxopt::v1::CreateJobRequest request;
  *request.mutable_model() = *reference;
  *request.mutable_config() = *config;
  for (const auto& input : inputs) *request.add_inputs() = input;
  for (const auto& [key, value] : LabelsFrom(args)) (*request.mutable_labels())[key] = value;
  absl::StatusOr<onnxopt::v1::Job> job;
  if (args.Has("--request-id")) {
    request.set_request_id(args.Get("--request-id"));
    job = client.CreateJob(request);
  } else {
    // The request stands for itself: running the same submit again (a retry after a lost answer, a
    // pipeline step re-run) finds the first job, queued, running or succeeded. One that failed or was
    // cancelled is not an answer to keep giving: the next id in the series runs it again.
    const std::string base = onnxopt::client::DefaultRequestId(request);
    for (int attempt = 1; attempt <= kMaxResubmissions; ++attempt) {
      request.set_request_id(attempt == 1 ? base : absl::StrCat(base, "-", attempt));
      job = client.CreateJob(request);
      if (!job.ok() || (job->state() != onnxopt::v1::FAILED && job->state() != onnxopt::v1::CANCELLED)) break;
    }
  }
  if (!job.ok()) return Report(job.status());
  const bool json = args.Has("--json");
  const bool follow = args.Has("--wait") || args.Has("-o");
  if (!json) {
    std::cout << job->name() << std::endl;
  } else if (!follow) {
    std::cout << onnxopt::client::ToJson(*job) << std::flush;  // one JSON document per command
  }
  if (!follow) return kOk;
  fs::path out = args.Has("-o") ? fs::path(args.Get("-o")) : fs::path(model.stem().string() + ".optimized.onnx");
  return Follow(client, job->name(), Destination{out, *repository}, json);
}

// A session of `model`, which may hold tensors by reference.
absl::StatusOr<std::unique_ptr<Ort::Session>> SessionOf(const onnx::ModelProto& model,
                                                       const onnxopt::SessionSettings& settings) {
  absl::StatusOr<onnxopt::ModelSource> source = onnxopt::RuntimeSource(model);
  if (!source.ok()) return source.status();
  return onnxopt::CreateSession(*source, settings);
}

// Both models timed side by side on `device`, as a job's benchmark times them.
// Times both models side by side with the benchmark's session settings, and for a model with a key/value
// cache its generation phases and greedy generation (generation.h).
absl::Status CompareLatency(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                            const onnxopt::v1::OptimizationConfig& config, const onnxopt::SessionSettings& device,
                            const std::vector<onnxopt::SuppliedSample>& supplied, onnxopt::v1::Report* report) {
  const onnxopt::SessionSettings settings = onnxopt::BenchmarkSettings(config, device, report->mutable_benchmark());
  auto a = SessionOf(original, settings);
  if (!a.ok()) return a.status();
  auto b = SessionOf(optimized, settings);
  if (!b.ok()) return b.status();
  auto inputs = onnxopt::BenchmarkInputs(**a, original, config.validation(), supplied);
  if (!inputs.ok()) return inputs.status();
  const onnxopt::TimingMode mode;  // plain runs on host tensors, as compare has always timed
  absl::Status timed = onnxopt::Benchmark(**a, **b, *inputs, config.benchmark(), nullptr, report->mutable_benchmark(), mode);
  if (!timed.ok()) return timed;
  return onnxopt::ReportGeneration(**a, **b, original, onnxopt::ModelPrecision(optimized) == "fp32", config.benchmark(),
                                   mode, nullptr, report);
}

int Local(const Args& args) {
  const std::string& command = args.positional[0];
  auto config = ConfigFrom(args);
  if (!config.ok()) return Report(config.status());
  if (command == "optimize") {
    if (args.positional.size() != 2 || !args.Has("-o")) {
      return (std::cerr << "usage: onnxopt optimize MODEL -o OUT.onnx [--config FILE]\n", kUsage);
    }
    const fs::path out = args.Get("-o");
    auto repository = RepositoryFrom(args);
    if (!repository.ok()) return Report(repository.status());
    if (*repository) {
      absl::Status fits = onnxopt::client::CheckModelFitsLayout(args.positional[1], **repository);
      if (!fits.ok()) return Report(fits);
    }
    // The job works inside a repository, beside a file or a GenAI folder (which appears whole).
    const bool inside = *repository && (*repository)->layout != onnxopt::client::RepositoryLayout::kGenai;
    const fs::path work = inside ? out : out.parent_path().empty() ? fs::path(".") : out.parent_path();
    std::error_code created;
    fs::create_directories(work, created);
    const fs::path staging = work / (".onnxopt-" + std::to_string(::getpid()));
    onnxopt::OptimizeRequest request;
    request.model_path = args.positional[1];
    request.output_dir = staging;
    request.config = *config;
    request.durable_output = false;  // a local file, like cp's: the kernel writes it back (no fsync)
    if (args.Has("--inputs")) {
      auto files = onnxopt::client::FindInputFiles(args.Get("--inputs"));
      if (!files.ok()) return Report(files.status());
      request.input_files = *std::move(files);
    }
    ProgressLine line;
    request.on_progress = [&](onnxopt::Phase phase, const std::string& step, int done, int total) {
      static constexpr const char* kPhaseNames[] = {"loading", "optimizing", "saving", "validating", "benchmarking"};
      const std::string phase_name = kPhaseNames[static_cast<int>(phase)];
      line.Show(total > 0 ? absl::StrCat(phase_name, "  pass ", done + 1, "/", total, " ", step)
                          : absl::StrCat(phase_name, step.empty() ? "" : "  ", step));
    };
    onnxopt::v1::Report report;
    auto result = onnxopt::Optimize(request, &report);
    line.Done();
    std::error_code error;
    std::optional<std::pair<fs::path, fs::path>> delivered;
    if (result.ok()) {
      // The data file is named after the output, as the model now says; the report goes beside it (or
      // into the repository), as a job's does.
      std::vector<fs::path> made = result->files;
      made.push_back(staging / onnxopt::kReportFileName);
      const std::vector<ResultFile> files = onnxopt::client::LocalResultFiles(made);
      absl::Status written = onnxopt::WriteFileAtomically(made.back(), onnxopt::client::ToJson(report));
      auto moved = written.ok() ? Deliver(files, report, Destination{out, *repository})
                                : absl::StatusOr<std::pair<fs::path, fs::path>>(written);
      if (moved.ok()) {
        delivered = *moved;
      } else {
        result = moved.status();
      }
    }
    fs::remove_all(staging, error);
    // A model that never loaded has no report to show: only the error (a parser must not take an empty
    // report for a result).
    if (!result.ok() && !report.has_original()) return Report(result.status());
    std::cout << (args.Has("--json") ? onnxopt::client::ToJson(report) : onnxopt::client::FormatReport(report));
    if (args.Has("--html")) {
      absl::Status written = WriteHtml(report, args.Get("--html"));
      if (!written.ok()) return Report(written);
    }
    if (!result.ok()) return Report(result.status());
    if (!args.Has("--json")) {
      std::cout << DeliveredLabel(*repository) << delivered->first.string()
                << "\nreport:          " << delivered->second.string() << std::endl;
    }
    return kOk;
  }
  // compare
  if (args.positional.size() != 3) return (std::cerr << "usage: onnxopt compare ORIGINAL OPTIMIZED\n", kUsage);
  // Big tensors stay in their files: a multi-GB model is neither held whole nor serialized (RuntimeSource).
  auto original = onnxopt::LoadModelByReference(args.positional[1]);
  if (!original.ok()) return Report(original.status());
  auto optimized = onnxopt::LoadModelByReference(args.positional[2]);
  if (!optimized.ok()) return Report(optimized.status());
  onnxopt::v1::Report report;
  report.set_job("compare");
  auto device = onnxopt::DeviceSettings(*config, &report);  // --device cuda runs both there, or says why not
  if (!device.ok()) return Report(device.status());
  auto original_session = SessionOf(*original, *device);
  if (!original_session.ok()) return Report(original_session.status());
  auto optimized_session = SessionOf(*optimized, *device);
  if (!optimized_session.ok()) return Report(optimized_session.status());
  std::vector<onnxopt::SuppliedSample> supplied;
  if (args.Has("--inputs")) {
    auto files = onnxopt::client::FindInputFiles(args.Get("--inputs"));
    if (!files.ok()) return Report(files.status());
    auto loaded = onnxopt::LoadSuppliedInputs(*files);
    if (!loaded.ok()) return Report(loaded.status());
    supplied = *std::move(loaded);
  }
  std::optional<Ort::LoraAdapter> adapter;
  Ort::RunOptions adapter_options;
  if (args.Has("--adapter")) {
    auto bytes = onnxopt::ReadFile(args.Get("--adapter"));
    if (!bytes.ok()) return Report(bytes.status());
    auto parsed = onnxopt::ParseAdapter(*bytes);
    if (!parsed.ok()) return Report(parsed.status());
    if (absl::Status fits = onnxopt::CheckAdapterFitsModel(*parsed, *optimized); !fits.ok()) return Report(fits);
    auto loaded = onnxopt::LoadLoraAdapter(*bytes);
    if (!loaded.ok()) return Report(loaded.status());
    adapter = *std::move(loaded);
    adapter_options.AddActiveLoraAdapter(*adapter);
  }
  absl::Status status = onnxopt::CheckParity(**original_session, **optimized_session, *original, config->validation(),
                                             nullptr, report.mutable_parity(), onnxopt::ModelPrecision(*optimized),
                                             supplied, adapter ? &adapter_options : nullptr);
  if (!status.ok()) return Report(status);
  if (config->benchmark().skip() || adapter) {  // the timing binds inputs, which adapters do not reach
    report.mutable_benchmark()->set_skipped(true);
  } else {
    absl::Status timed = CompareLatency(*original, *optimized, *config, *device, supplied, &report);
    if (!timed.ok()) return Report(timed);
  }
  std::cout << (args.Has("--json") ? onnxopt::client::ToJson(report) : onnxopt::client::FormatReport(report));
  const bool generation_passed = !report.has_generation() || report.generation().passed();
  return report.parity().passed() && generation_passed ? kOk : kJobFailed;
}

// `adapters convert CHECKPOINT... --model M -o OUT`: the checkpoints as one adapter of the model (their
// sum), which ONNX Runtime must load before it is written.
int ConvertAdapter(const Args& args) {
  auto model = onnxopt::LoadModelByReference(args.Get("--model"));
  if (!model.ok()) return Report(model.status());
  std::vector<std::string> notes;
  std::vector<std::vector<onnx::TensorProto>> adapters;
  for (size_t i = 2; i < args.positional.size(); ++i) {
    auto converted = onnxopt::ConvertPeftCheckpoint(args.positional[i], *model, &notes);
    if (!converted.ok()) return Report(converted.status());
    adapters.push_back(*std::move(converted));
  }
  auto parameters = onnxopt::ConcatenateAdapters(adapters);
  if (!parameters.ok()) return Report(parameters.status());
  if (absl::Status fits = onnxopt::CheckAdapterFitsModel(*parameters, *model); !fits.ok()) return Report(fits);
  auto bytes = onnxopt::SerializeAdapter(*parameters);
  if (!bytes.ok()) return Report(bytes.status());
  if (auto loaded = onnxopt::LoadLoraAdapter(*bytes); !loaded.ok()) return Report(loaded.status());
  if (absl::Status written = onnxopt::WriteFileAtomically(args.Get("-o"), *bytes); !written.ok()) return Report(written);
  for (const std::string& note : notes) std::cerr << "onnxopt: note: " << note << "\n";
  std::cout << "adapter: " << args.Get("-o") << " (" << parameters->size() / 2 << " modules, " << bytes->size()
            << " bytes)" << std::endl;
  return kOk;
}

int PrintPasses(const onnxopt::v1::ListPassesResponse& passes, bool json, const std::string& source) {
  if (json) {
    std::cout << onnxopt::client::ToJson(passes);
    return kOk;
  }
  if (!source.empty()) std::cout << source << "\n\n";
  for (const auto& pass : passes.passes()) std::cout << absl::StrFormat("%-32s %s\n", pass.name(), pass.description());
  std::cout << "\npresets:\n";
  for (const auto& preset : passes.presets()) std::cout << absl::StrFormat("  %-10s %s\n", preset.name(), preset.description());
  return kOk;
}

int Run(const Args& args) {
  const std::string& command = args.positional[0];
  if (command == "optimize" || command == "compare") return Local(args);
  if (command == "adapters") return ConvertAdapter(args);
  const char* env_server = std::getenv("ONNXOPT_SERVER");
  if (env_server != nullptr && *env_server == '\0') env_server = nullptr;  // set but empty: unset
  if (command == "passes" && !args.Has("--server") && env_server == nullptr) {
    // No server named: the passes this onnxopt itself has (the same library the server runs).
    return PrintPasses(onnxopt::DescribePasses(onnxopt::DefaultPassRegistry()), args.Has("--json"),
                       "this onnxopt's passes (--server or $ONNXOPT_SERVER asks a server)");
  }
  auto from_env = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value != nullptr ? value : "");
  };
  onnxopt::client::TlsFiles tls{args.Get("--tls-ca", from_env("ONNXOPT_TLS_CA")),
                                args.Get("--tls-cert", from_env("ONNXOPT_TLS_CERT")),
                                args.Get("--tls-key", from_env("ONNXOPT_TLS_KEY"))};
  auto credentials = onnxopt::client::ChannelCredentialsFor(tls);
  if (!credentials.ok()) return Report(credentials.status());
  Client client(args.Get("--server", env_server != nullptr ? env_server : "127.0.0.1:50051"), *credentials,
                args.Get("--tls-server-name"));
  client.set_token(args.Get("--token", from_env("ONNXOPT_TOKEN")));
  if (args.Has("--timeout")) {
    double seconds = 0;
    if (!absl::SimpleAtod(args.Get("--timeout"), &seconds) || !(seconds > 0)) {
      return (std::cerr << "onnxopt: --timeout needs a number of seconds > 0\n", kUsage);
    }
    client.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds)));
  }
  if (command == "health") {
    // One try, no retries: a probe's answer is now (exit 0 SERVING, 1 anything else).
    if (!args.Has("--timeout")) client.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto serving = client.CheckHealth(args.Get("--service"));
    if (!serving.ok()) {
      std::cerr << "onnxopt: health: " << absl::StatusCodeToString(serving.status().code()) << ": "
                << serving.status().message() << std::endl;
      return kJobFailed;
    }
    std::cout << (*serving == 1 ? "SERVING" : *serving == 2 ? "NOT_SERVING" : "UNKNOWN") << std::endl;
    return *serving == 1 ? kOk : kJobFailed;
  }
  const bool json = args.Has("--json");
  auto need_job = [&]() -> std::optional<std::string> {
    if (args.positional.size() != 2) return std::nullopt;
    return args.positional[1];
  };
  if (command == "submit") return Submit(client, args);
  if (command == "status" || command == "cancel" || command == "watch" || command == "report" || command == "download" ||
      command == "delete") {
    std::optional<std::string> name = need_job();
    if (!name) return (std::cerr << "usage: onnxopt " << command << " JOB\n", kUsage);
    if (command == "delete") {
      auto deleted = client.DeleteJob(*name);
      if (!deleted.ok()) return Report(deleted.status());
      std::cout << (json ? onnxopt::client::ToJson(*deleted)
                         : absl::StrCat("deleted ", deleted->name(), ": ", deleted->blobs_deleted(), " blob(s), ",
                                        deleted->bytes_freed(), " bytes freed\n"));
      return kOk;
    }
    if (command == "status" || command == "cancel") {
      auto job = command == "status" ? client.GetJob(*name) : client.CancelJob(*name);
      if (!job.ok()) return Report(job.status());
      std::cout << (json ? onnxopt::client::ToJson(*job) : onnxopt::client::FormatJob(*job));
      return kOk;
    }
    if (command == "watch") {
      auto job = client.WatchJob(*name, [&](const onnxopt::v1::Job& event) {
        std::cout << (json ? onnxopt::client::ToJson(event) : onnxopt::client::FormatProgressLine(event) + "\n") << std::flush;
      });
      if (!job.ok()) return Report(job.status());
      return ExitForJob(*job);
    }
    if (command == "report") {
      auto report = client.GetReport(*name);
      if (!report.ok()) return Report(report.status());
      const std::string format = args.Get("--format", json ? "json" : args.Has("--html") ? "html" : "table");
      if (format == "kfp") {
        std::cout << onnxopt::client::FormatKfpMetrics(*report);
        return kOk;
      }
      if (format == "mlflow") {
        auto job = client.GetJob(*name);
        if (!job.ok()) return Report(job.status());
        std::cout << onnxopt::client::FormatMlflow(*report, &*job);
        return kOk;
      }
      if (format == "html" && !args.Has("--html")) {
        std::cout << onnxopt::client::RenderReportHtml(*report);
        return kOk;
      }
      if (args.Has("--html")) {
        absl::Status written = WriteHtml(*report, args.Get("--html"));
        if (!written.ok()) return Report(written);
        std::cout << "report: " << args.Get("--html") << std::endl;
        return kOk;
      }
      std::cout << (format == "json" ? onnxopt::client::ToJson(*report) : onnxopt::client::FormatReport(*report));
      return kOk;
    }
    // download
    auto job = client.GetJob(*name);
    if (!job.ok()) return Report(job.status());
    const std::string artifact = args.Get("--artifact", onnxopt::kModelFileName);
    auto repository = RepositoryFrom(args);
    if (!repository.ok()) return Report(repository.status());
    if (*repository && artifact != onnxopt::kModelFileName) {
      return Report(absl::InvalidArgumentError("--layout delivers the whole result: leave out --artifact"));
    }
    if (artifact == onnxopt::kModelFileName) {
      if (job->state() != onnxopt::v1::SUCCEEDED) {
        return Report(absl::FailedPreconditionError(absl::StrCat("JOB_NOT_DONE: ", *name, " is ",
                                                                 onnxopt::v1::JobState_Name(job->state()))));
      }
      const fs::path out = args.Get("-o", "model.optimized.onnx");
      auto delivered = DownloadResult(client, *job, Destination{out, *repository});
      if (!delivered.ok()) return Report(delivered.status());
      const char* what = *repository ? "repository" : "model";
      if (json) {
        std::cout << onnxopt::client::JsonObject({{what, delivered->first.string()}, {"report", delivered->second.string()}});
      } else {
        std::cout << DeliveredLabel(*repository) << delivered->first.string()
                  << "\nreport:          " << delivered->second.string() << std::endl;
      }
      return kOk;
    }
    const fs::path out = args.Get("-o", artifact);
    absl::Status status = client.Download(*name, artifact, out);
    if (!status.ok()) return Report(status);
    std::cout << (json ? onnxopt::client::JsonObject({{artifact, out.string()}}) : out.string() + "\n");
    return kOk;
  }
  if (command == "list") {
    onnxopt::v1::JobState state = onnxopt::v1::JOB_STATE_UNSPECIFIED;
    if (args.Has("--state") && !onnxopt::v1::JobState_Parse(absl::AsciiStrToUpper(args.Get("--state")), &state)) {
      return (std::cerr << "onnxopt: unknown state " << args.Get("--state") << "\n", kUsage);
    }
    int page_size = 0;
    if (args.Has("--page-size") && !absl::SimpleAtoi(args.Get("--page-size"), &page_size)) {
      return (std::cerr << "onnxopt: --page-size needs a number\n", kUsage);
    }
    auto page = client.ListJobs(state, page_size, args.Get("--page-token"), LabelsFrom(args));
    if (!page.ok()) return Report(page.status());
    if (json) {
      std::cout << onnxopt::client::ToJson(*page);
      return kOk;
    }
    for (const auto& job : page->jobs()) {
      std::cout << absl::StrFormat("%-26s %-40s %s\n", job.name(), onnxopt::client::FormatProgressLine(job),
                                   job.model().display_name());
    }
    if (!page->next_page_token().empty()) std::cout << "next page: --page-token " << page->next_page_token() << "\n";
    return kOk;
  }
  if (command == "passes") {
    auto passes = client.ListPasses();
    if (!passes.ok()) return Report(passes.status());
    return PrintPasses(*passes, json, "");
  }
  if (command == "info") {
    auto info = client.GetServerInfo();
    if (!info.ok()) return Report(info.status());
    if (json) {
      std::cout << onnxopt::client::ToJson(*info);
      return kOk;
    }
    std::cout << "onnxopt-server " << info->version() << "\nONNX Runtime   " << info->onnxruntime_version()
              << "\nonnx           " << info->onnx_version() << " (checker knows opsets up to " << info->max_opset()
              << ")\nproviders      " << absl::StrJoin(info->execution_providers(), ", ");
    for (const auto& provider : info->providers()) {
      std::cout << "\n  " << provider.name() << ": "
                << (provider.usable() ? "usable here" : absl::StrCat("not usable here (", provider.reason(), ")"));
    }
    std::cout << "\nworkers        "
              << info->workers() << ", queue capacity " << info->queue_capacity() << "\nreplica        "
              << info->replica_id() << " (role " << info->role() << ", " << info->job_store() << " job store)"
              << "\ndraining       " << (info->draining() ? "yes" : "no") << std::endl;
    return kOk;
  }
  std::cerr << "onnxopt: unknown command '" << command << "' (onnxopt --help lists them)\n";
  return kUsage;
}

constexpr char kFooter[] = R"(CONFIG OPTIONS of submit, optimize and compare win over the --config file.
The server is --server ADDR, else $ONNXOPT_SERVER, else 127.0.0.1:50051.
Exit codes: 0 ok, 1 job failed, 2 usage, 3 server error, 4 cancelled, 5 input rejected.)";

// The command line, parsed by CLI11 (subcommands, per-command --help, typed checks) into the Args the
// commands read. Returns -1 when a command should run, else the exit code (help: 0, errors: 2).
int ParseCommandLine(int argc, char** argv, Args* args) {
  CLI::App app("onnxopt: the command-line client of onnxopt-server, plus local optimize and compare", "onnxopt");
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", absl::StrCat("onnxopt ", onnxopt::kOptimizerVersion, " (ONNX Runtime ",
                                                 onnxopt::OrtVersion(), ")"));
  app.fallthrough();  // --server may come after the command too
  app.footer(kFooter);
  std::map<std::string, std::string> values;  // one slot per option name, shared by the commands
  std::vector<std::pair<std::string, CLI::Option*>> given;
  int page_size = 0;
  std::vector<std::string> positional(2);
  std::vector<std::string> checkpoints;  // adapters convert
  given.push_back({"--server", app.add_option("--server", values["--server"], "onnxopt-server address")
                                   ->type_name("ADDR")});
  given.push_back({"--tls-ca", app.add_option("--tls-ca", values["--tls-ca"],
                                              "TLS: CA bundle that signed the server's certificate (else "
                                              "$ONNXOPT_TLS_CA; neither and no client certificate: plaintext)")
                                   ->type_name("FILE")});
  given.push_back({"--tls-cert", app.add_option("--tls-cert", values["--tls-cert"],
                                                "TLS: client certificate for mutual TLS (else $ONNXOPT_TLS_CERT)")
                                     ->type_name("FILE")});
  given.push_back({"--tls-key", app.add_option("--tls-key", values["--tls-key"],
                                               "TLS: the client certificate's key (else $ONNXOPT_TLS_KEY)")
                                    ->type_name("FILE")});
  given.push_back({"--token", app.add_option("--token", values["--token"],
                                             "bearer token for servers with --auth-tokens-file (else $ONNXOPT_TOKEN; "
                                             "the environment keeps it out of the process list)")
                                  ->type_name("TOKEN")});
  given.push_back({"--tls-server-name", app.add_option("--tls-server-name", values["--tls-server-name"],
                                                       "TLS: the name to check the server's certificate against "
                                                       "(default: the --server host; for probes dialing localhost)")
                                            ->type_name("NAME")});
  given.push_back({"--timeout", app.add_option("--timeout", values["--timeout"],
                                               "give up after this long, retries included (DEADLINE_EXCEEDED; "
                                               "default: no limit; health: 5 s)")
                                    ->type_name("SECONDS")});

  auto value = [&](CLI::App* command, const std::string& name, const std::string& type, const std::string& help) {
    CLI::Option* option = command->add_option(name, values[name], help)->type_name(type);
    given.push_back({name, option});
    return option;
  };
  auto flag = [&](CLI::App* command, const std::string& name, const std::string& help) {
    given.push_back({name, command->add_flag(name, help)});
  };
  auto json = [&](CLI::App* command) { flag(command, "--json", "print JSON (protobuf field names)"); };
  // What a run of two models reads of a config (compare): the validation and benchmark settings.
  auto run_options = [&](CLI::App* command) {
    value(command, "--config", "FILE.json", "an onnxopt.v1.OptimizationConfig in protobuf JSON");
    value(command, "--device", "cpu|cuda", "where parity and the benchmark run")
        ->check(CLI::Validator(
            [](std::string& name) -> std::string { return ParseDevice(name) ? "" : "use cpu or cuda"; }, ""));
    CLI::Option* dims = command->add_option("--dim", args->dims, "NAME=N: a dynamic dimension's value (repeatable)")
                            ->type_name("NAME=N")
                            ->expected(1)
                            ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
                            ->check(CLI::Validator(
                                [](std::string& dim) -> std::string {
                                  return ParseDim(dim) ? "" : kDimUsage;
                                },
                                ""));
    given.push_back({"--dim", dims});
  };
  auto config_options = [&](CLI::App* command) {
    run_options(command);
    std::vector<std::string> presets;
    for (const onnxopt::Preset* preset : onnxopt::DefaultPassRegistry().presets()) presets.push_back(preset->name);
    value(command, "--preset", "NAME",
          "auto (the default: the best pipeline for what the model is), basic, extended, transformer, none")
        ->check(CLI::IsMember(presets));
    value(command, "--precision", "MODE",
          "fp32 (default), fp16, bf16, int8_dynamic, int8_static, int4_weight_only, or auto (the fastest float "
          "precision that passes parity on the job's device)")
        ->check(CLI::IsMember({"fp32", "fp16", "bf16", "int8_dynamic", "int8_static", "int4_weight_only", "auto"}));
    value(command, "--calibration", "METHOD", "int8_static's calibration: minmax (default), percentile or entropy")
        ->check(CLI::IsMember({"minmax", "percentile", "entropy"}));
  };
  auto inputs = [&](CLI::App* command) {
    value(command, "--inputs", "DIR",
          "real inputs to validate on: DIR/test_data_set_N/input_K.pb or DIR/NAME.pb (TensorProtos)");
  };
  auto job = [&](CLI::App* command) { command->add_option("JOB", positional[0], "the job's name")->required(); };
  auto labels = [&](CLI::App* command, const std::string& help) {
    given.push_back({"--label", command->add_option("--label", args->labels, help)
                                    ->type_name("KEY=VALUE")
                                    ->expected(1)
                                    ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
                                    ->check(CLI::Validator(
                                        [](std::string& label) -> std::string {
                                          return ParseLabel(label) ? "" : "use KEY=VALUE";
                                        },
                                        ""))});
  };
  // A model repository instead of a file: -o names the repository's folder.
  auto repository = [&](CLI::App* command) {
    value(command, "--layout", "triton|kserve|genai",
          "write a model repository at -o: NAME/config.pbtxt and NAME/VERSION/model.onnx (kserve: and "
          "inferenceservice.yaml); genai: a folder ONNX Runtime GenAI loads (model.onnx, genai_config.json, "
          "the tokenizer)")
        ->check(CLI::IsMember({"triton", "kserve", "genai"}));
    value(command, "--model-name", "NAME", "the model's name in the repository (with --layout)");
    value(command, "--version", "N", "the model version folder (default 1; an existing one is refused)");
    value(command, "--max-batch-size", "N", "config.pbtxt's max_batch_size where the batch dim is dynamic (default 8)");
    value(command, "--storage-uri", "URI", "kserve: where the repository will be served from (default "
                                           "pvc://onnxopt-models/<folder>)");
    value(command, "--tokenizer", "DIR",
          "genai: the Hugging Face folder whose tokenizer files go beside the model (its config.json and "
          "generation_config.json give the context length and token ids)");
    value(command, "--context-length", "N", "genai: the positions the model takes (default: config.json's "
                                            "max_position_embeddings, or the model's stored rotary table)");
    value(command, "--genai-type", "TYPE", "genai: model.type (default: config.json's model_type where GenAI "
                                           "knows it, else decoder)");
  };

  CLI::App* submit = app.add_subcommand("submit", "upload MODEL (and its external data) and queue a job");
  submit->add_option("MODEL", positional[0], "the .onnx file")->required();
  config_options(submit);
  inputs(submit);
  flag(submit, "--wait", "follow the job and download the result");
  value(submit, "-o", "OUT.onnx", "follow the job and download the optimized model (and its report) here");
  value(submit, "--request-id", "ID",
        "makes a retry return the same job (default: a digest of the model, data, inputs, config and labels, "
        "so the same submit run again finds the first job)");
  labels(submit, "a label on the job, to find it by (repeatable; list --label filters)");
  repository(submit);
  flag(submit, "--json",
       "print the job as JSON; with --wait or -o, one {\"job\": ..., \"report\": ...} object once it ends");

  CLI::App* status = app.add_subcommand("status", "show a job");
  job(status);
  json(status);
  CLI::App* list = app.add_subcommand("list", "jobs, newest first");
  value(list, "--state", "STATE", "only jobs in this state")
      ->check(CLI::IsMember({"queued", "running", "succeeded", "failed", "cancelled"}, CLI::ignore_case));
  given.push_back({"--page-size", list->add_option("--page-size", page_size, "jobs per page (1-500)")
                                      ->check(CLI::Range(1, 500))});
  value(list, "--page-token", "T", "the page after a previous one");
  labels(list, "only jobs with this label (repeatable: all of them)");
  json(list);
  CLI::App* watch = app.add_subcommand("watch", "print progress until the job ends");
  job(watch);
  json(watch);
  CLI::App* cancel = app.add_subcommand("cancel", "cancel a queued or running job");
  job(cancel);
  json(cancel);
  CLI::App* remove = app.add_subcommand("delete", "delete a finished job, its artifacts and the blobs only it used");
  job(remove);
  json(remove);
  CLI::App* download = app.add_subcommand("download", "download a finished job's model and report, or one artifact");
  job(download);
  value(download, "-o", "OUT", "where to write it");
  value(download, "--artifact", "NAME", "model.onnx (the default), report.json, an external data file, ...");
  repository(download);
  json(download);
  CLI::App* report = app.add_subcommand("report", "the job's report as a table, JSON or one HTML page");
  job(report);
  json(report);
  value(report, "--html", "FILE", "write the report as one self-contained page with charts");
  value(report, "--format", "FORMAT",
        "table (default), json, html (to stdout), mlflow ({params, metrics, tags} as an MLflow run logs them) or "
        "kfp (Kubeflow Pipelines' metrics file)")
      ->check(CLI::IsMember({"table", "json", "html", "mlflow", "kfp"}));
  json(app.add_subcommand("passes", "passes and presets (of the server given by --server or $ONNXOPT_SERVER, "
                                    "else of this onnxopt, no server needed)"));
  CLI::App* health = app.add_subcommand("health", "gRPC health check (a probe): exit 0 when SERVING, 1 otherwise");
  value(health, "--service", "NAME", "a service's health, e.g. onnxopt.v1.Optimizer (default: the server's)");
  json(app.add_subcommand("info", "server version, ONNX Runtime version, execution providers"));

  CLI::App* optimize = app.add_subcommand("optimize", "run the pipeline and validation locally, no server");
  optimize->add_option("MODEL", positional[0], "the .onnx file")->required();
  value(optimize, "-o", "OUT.onnx", "the optimized model (and OUT.report.json), or the repository with --layout")
      ->required();
  config_options(optimize);
  inputs(optimize);
  json(optimize);
  value(optimize, "--html", "FILE", "also write the report as one HTML page");
  repository(optimize);
  CLI::App* compare = app.add_subcommand(
      "compare", "run two models on the same inputs in ONNX Runtime: compare outputs, time them side by side");
  compare->add_option("ORIGINAL", positional[0], "the reference model")->required();
  compare->add_option("OPTIMIZED", positional[1], "the model to check")->required();
  run_options(compare);
  inputs(compare);
  value(compare, "--adapter", "FILE.onnx_adapter",
        "run OPTIMIZED with this LoRA adapter active (ONNX Runtime's adapter API); parity only, no timing");
  json(compare);
  CLI::App* adapters = app.add_subcommand("adapters", "LoRA adapters for models optimized with extract_adapters");
  adapters->add_option("ACTION", positional[0], "convert: a peft checkpoint into an .onnx_adapter")
      ->required()
      ->check(CLI::IsMember({"convert"}));
  adapters->add_option("CHECKPOINTS", checkpoints,
                       "peft folders (adapter_config.json, adapter_model.safetensors); several: one adapter that adds "
                       "them (their ranks concatenated)")
      ->required();
  value(adapters, "--model", "MODEL.onnx", "the optimized model the adapter is for (names and shapes are checked)")
      ->required();
  value(adapters, "-o", "OUT.onnx_adapter", "where to write the adapter")->required();

  // A word where the command goes that names none: say so (CLI11 would only ask for a command).
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--server" || word == "--tls-ca" || word == "--tls-cert" || word == "--tls-key" || word == "--token" ||
        word == "--tls-server-name" || word == "--timeout") {
      ++i;
    } else if (!absl::StartsWith(word, "-")) {
      try {
        app.get_subcommand(word);
      } catch (const CLI::OptionNotFound&) {
        std::cerr << "onnxopt: unknown command '" << word << "' (onnxopt --help lists them)\n";
        return kUsage;
      }
      break;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help, or the error
    return code == 0 ? kOk : kUsage;
  }
  CLI::App* chosen = app.get_subcommands().front();
  args->positional = {chosen->get_name()};
  for (const std::string& value : positional) {
    if (!value.empty()) args->positional.push_back(value);
  }
  args->positional.insert(args->positional.end(), checkpoints.begin(), checkpoints.end());
  for (const auto& [name, option] : given) {
    if (option->count() == 0) continue;
    args->options[name] = name == "--page-size" ? std::to_string(page_size) : values[name];
    // "-o out/" names the folder "out" (its parent is where a result is staged beside it).
    std::string& value = args->options[name];
    if (name == "-o") {
      while (value.size() > 1 && value.back() == '/') value.pop_back();
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  const int parsed = ParseCommandLine(argc, argv, &args);
  if (parsed >= 0) return parsed;
  try {
    return Run(args);
  } catch (const std::exception& e) {
    std::cerr << "onnxopt: internal error: " << e.what() << std::endl;
    return kServerError;
  }
}
