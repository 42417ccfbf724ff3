// `onnxopt submit MODEL [options]`: upload the model (and its data, and real inputs), queue a job;
// with --wait or -o, follow it and download the result.
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands/commands.h"
#include "client/commands/delivery.h"
#include "client/commands/progress_line.h"
#include "client/commands/server_command.h"
#include "client/report_format.h"

namespace onnxopt::cli {
namespace fs = std::filesystem;
namespace {

// How many times the same request (its default request id) may be run again after failing.
constexpr int kMaxResubmissions = 100;

// Creates the job. Without an id, the request stands for itself: running the same submit again (a
// retry after a lost answer, a pipeline step re-run) finds the first job, queued, running or
// succeeded. One that failed or was cancelled is not an answer to keep giving: the next id in the
// series runs it again.
absl::StatusOr<v1::Job> CreateOnce(client::Client& client, v1::CreateJobRequest request) {
  if (!request.request_id().empty()) return client.CreateJob(request);
  const std::string base = client::DefaultRequestId(request);
  absl::StatusOr<v1::Job> job;
  for (int attempt = 1; attempt <= kMaxResubmissions; ++attempt) {
    request.set_request_id(attempt == 1 ? base : absl::StrCat(base, "-", attempt));
    job = client.CreateJob(request);
    if (!job.ok() || (job->state() != v1::FAILED && job->state() != v1::CANCELLED)) break;
  }
  return job;
}

// Waits for the job and downloads its result to `to`. With `json`: the final job, then its report.
int Follow(client::Client& client, const std::string& name, const Destination& to, bool json) {
  ProgressLine line;
  auto final_job = client.WatchJob(name, [&](const v1::Job& job) {
    line.Show(absl::StrCat(name, "  ", client::FormatProgressLine(job)));
  });
  line.Done();
  if (!final_job.ok()) return Fail(final_job.status());
  if (final_job->state() != v1::SUCCEEDED) {
    if (json) {
      std::cout << client::JobAndReportJson(*final_job, nullptr);
    } else {
      std::cerr << client::FormatJob(*final_job);
    }
    return ExitForJob(*final_job);
  }
  auto delivered = DownloadResult(client, *final_job, to);
  if (!delivered.ok()) return Fail(delivered.status());
  if (json) {
    auto report = client.GetReport(name);
    if (!report.ok()) return Fail(report.status());
    std::cout << client::JobAndReportJson(*final_job, &*report);
    return kOk;
  }
  PrintDelivered(to, *delivered);
  const auto& result = final_job->result();
  std::cout << absl::StrFormat("nodes %d -> %d, parity %s, speedup %.3fx", result.nodes_before(), result.nodes_after(),
                               result.parity_passed() ? "passed" : "not checked", result.speedup())
            << std::endl;
  return kOk;
}

class SubmitCommand : public ServerCommand {
 public:
  SubmitCommand(CLI::App& app, const ConnectionOptions& connection)
      : ServerCommand(app, "submit", "upload MODEL (and its external data) and queue a job", connection) {
    cli()->add_option("MODEL", model_, "the .onnx file")->required();
    AddConfigOptions(cli(), &config_);
    AddInputsOption(cli(), &inputs_);
    cli()->add_flag("--wait", wait_, "follow the job and download the result");
    AddOutOption(cli(), &out_, "OUT.onnx", "follow the job and download the optimized model (and its report) here");
    Bind(cli(), "--request-id", &request_id_, "ID",
         "makes a retry return the same job (default: a digest of the model, data, inputs, config and labels, so "
         "the same submit run again finds the first job)");
    AddLabelOption(cli(), &labels_, "a label on the job, to find it by (repeatable; list --label filters)");
    AddRepositoryOptions(cli(), &repository_);
    cli()->add_flag("--json", json_,
                    "print the job as JSON; with --wait or -o, one {\"job\": ..., \"report\": ...} object once it ends");
  }

 protected:
  int RunWith(client::Client& client) override {
    auto config = ConfigFrom(config_);
    if (!config.ok()) return Fail(config.status());
    auto repository = RepositoryFrom(repository_, out_);  // checked before anything is uploaded
    if (!repository.ok()) return Fail(repository.status());
    if (*repository) {
      if (absl::Status fits = client::CheckModelFitsLayout(model_, **repository); !fits.ok()) return Fail(fits);
    }
    auto request = Request(client, *config);
    if (!request.ok()) return Fail(request.status());
    auto job = CreateOnce(client, *std::move(request));
    if (!job.ok()) return Fail(job.status());
    const bool follow = wait_ || out_.given();
    if (!json_) {
      std::cout << job->name() << std::endl;
    } else if (!follow) {
      std::cout << client::ToJson(*job) << std::flush;  // one JSON document per command
    }
    if (!follow) return kOk;
    const fs::path out = out_.given() ? fs::path(*out_) : fs::path(fs::path(model_).stem().string() + ".optimized.onnx");
    return Follow(client, job->name(), Destination{out, *repository}, json_);
  }

 private:
  // Uploads the model and the inputs; the request that names them.
  absl::StatusOr<v1::CreateJobRequest> Request(client::Client& client, const v1::OptimizationConfig& config) {
    ProgressLine line;
    auto reference = client.UploadModel(model_, [&](int64_t done, int64_t total) {
      line.Show(absl::StrFormat("uploading %.1f / %.1f MiB", done / 1048576.0, total / 1048576.0));
    });
    line.Done();
    if (!reference.ok()) return reference.status();
    v1::CreateJobRequest request;
    if (inputs_.given()) {
      auto uploaded = client.UploadInputs(*inputs_);
      if (!uploaded.ok()) return uploaded.status();
      for (const auto& input : *uploaded) *request.add_inputs() = input;
    }
    *request.mutable_model() = *reference;
    *request.mutable_config() = config;
    for (const auto& [key, value] : LabelsFrom(labels_)) (*request.mutable_labels())[key] = value;
    if (request_id_.given()) request.set_request_id(*request_id_);
    return request;
  }

  std::string model_;
  ConfigFlags config_;
  Flag<std::string> inputs_, out_, request_id_;
  bool wait_ = false;
  bool json_ = false;
  std::vector<std::string> labels_;
  RepositoryFlags repository_;
};

}  // namespace

std::unique_ptr<Command> NewSubmitCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<SubmitCommand>(app, connection);
}

}  // namespace onnxopt::cli
