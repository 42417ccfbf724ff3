// `onnxopt report JOB`: the job's report as a table, JSON, one HTML page, or a tracker's metrics.
#include <iostream>

#include "client/commands/commands.h"
#include "client/commands/delivery.h"
#include "client/commands/server_command.h"
#include "client/report_format.h"
#include "client/report_html.h"
#include "client/tracking_format.h"

namespace onnxopt::cli {
namespace {

class ReportCommand : public ServerCommand {
 public:
  ReportCommand(CLI::App& app, const ConnectionOptions& connection)
      : ServerCommand(app, "report", "the job's report as a table, JSON or one HTML page", connection) {
    AddJobArgument(cli(), &job_);
    AddJsonFlag(cli(), &json_);
    Bind(cli(), "--html", &html_, "FILE", "write the report as one self-contained page with charts");
    Bind(cli(), "--format", &format_, "FORMAT",
         "table (default), json, html (to stdout), mlflow ({params, metrics, tags} as an MLflow run logs them) or "
         "kfp (Kubeflow Pipelines' metrics file)")
        ->check(CLI::IsMember({"table", "json", "html", "mlflow", "kfp"}));
  }

 protected:
  int RunWith(client::Client& client) override {
    auto report = client.GetReport(job_);
    if (!report.ok()) return Fail(report.status());
    const std::string format = format_.given() ? *format_ : json_ ? "json" : html_.given() ? "html" : "table";
    if (format == "kfp") {
      std::cout << client::FormatKfpMetrics(*report);
    } else if (format == "mlflow") {
      auto job = client.GetJob(job_);
      if (!job.ok()) return Fail(job.status());
      std::cout << client::FormatMlflow(*report, &*job);
    } else if (html_.given()) {
      absl::Status written = WriteHtml(*report, *html_);
      if (!written.ok()) return Fail(written);
      std::cout << "report: " << *html_ << std::endl;
    } else if (format == "html") {
      std::cout << client::RenderReportHtml(*report);
    } else {
      std::cout << (format == "json" ? client::ToJson(*report) : client::FormatReport(*report));
    }
    return kOk;
  }

 private:
  std::string job_;
  bool json_ = false;
  Flag<std::string> html_, format_;
};

}  // namespace

std::unique_ptr<Command> NewReportCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<ReportCommand>(app, connection);
}

}  // namespace onnxopt::cli
