// `onnxopt download JOB`: a finished job's model with its data and report (or a model repository),
// or one artifact by name.
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/commands/commands.h"
#include "client/commands/delivery.h"
#include "client/commands/server_command.h"
#include "client/report_format.h"
#include "optimizer/failure.h"
#include "optimizer/result_files.h"

namespace onnxopt::cli {
namespace fs = std::filesystem;
namespace {

class DownloadCommand : public ServerCommand {
 public:
  DownloadCommand(CLI::App& app, const ConnectionOptions& connection)
      : ServerCommand(app, "download", "download a finished job's model and report, or one artifact", connection) {
    AddJobArgument(cli(), &job_);
    AddOutOption(cli(), &out_, "OUT", "where to write it");
    Bind(cli(), "--artifact", &artifact_, "NAME",
         absl::StrCat(kModelFileName, " (the default), ", kReportFileName, ", an external data file, ..."));
    AddRepositoryOptions(cli(), &repository_);
    AddJsonFlag(cli(), &json_);
  }

 protected:
  int RunWith(client::Client& client) override {
    auto job = client.GetJob(job_);
    if (!job.ok()) return Fail(job.status());
    const bool whole_result = !artifact_.given() || *artifact_ == kModelFileName;
    auto repository = RepositoryFrom(repository_, out_);
    if (!repository.ok()) return Fail(repository.status());
    if (*repository && !whole_result) {
      return Fail(absl::InvalidArgumentError("--layout delivers the whole result: leave out --artifact"));
    }
    return whole_result ? DownloadWhole(client, *job, Destination{OutOr("model.optimized.onnx"), *repository})
                        : DownloadOne(client, *artifact_);
  }

 private:
  fs::path OutOr(const std::string& fallback) const { return out_.given() ? fs::path(*out_) : fs::path(fallback); }

  int DownloadWhole(client::Client& client, const v1::Job& job, const Destination& to) {
    if (job.state() != v1::SUCCEEDED) {
      return Fail(Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::JOB_NOT_DONE,
                          absl::StrCat(job_, " is ", v1::JobState_Name(job.state()))));
    }
    auto delivered = DownloadResult(client, job, to);
    if (!delivered.ok()) return Fail(delivered.status());
    if (json_) {
      const char* what = to.repository ? "repository" : "model";
      std::cout << client::JsonObject({{what, delivered->where.string()}, {"report", delivered->report.string()}});
    } else {
      PrintDelivered(to, *delivered);
    }
    return kOk;
  }

  int DownloadOne(client::Client& client, const std::string& artifact) {
    const fs::path out = OutOr(artifact);
    if (absl::Status status = client.Download(job_, artifact, out); !status.ok()) return Fail(status);
    std::cout << (json_ ? client::JsonObject({{artifact, out.string()}}) : out.string() + "\n");
    return kOk;
  }

  std::string job_;
  Flag<std::string> out_, artifact_;
  RepositoryFlags repository_;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> NewDownloadCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<DownloadCommand>(app, connection);
}

}  // namespace onnxopt::cli
