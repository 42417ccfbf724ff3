// The commands on one job by name: `status`, `cancel`, `watch`, `delete`; and `list`, the jobs.
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/commands/commands.h"
#include "client/commands/server_command.h"
#include "client/report_format.h"

namespace onnxopt::cli {
namespace {

// A command whose one argument is a job: JOB and --json.
class JobCommand : public ServerCommand {
 public:
  JobCommand(CLI::App& app, const std::string& name, const std::string& description,
             const ConnectionOptions& connection)
      : ServerCommand(app, name, description, connection) {
    AddJobArgument(cli(), &job_);
    AddJsonFlag(cli(), &json_);
  }

 protected:
  const std::string& job() const { return job_; }
  bool json() const { return json_; }

 private:
  std::string job_;
  bool json_ = false;
};

// `status` and `cancel`: one call that answers with the job, which is printed.
class JobCallCommand : public JobCommand {
 public:
  using Call = absl::StatusOr<v1::Job> (client::Client::*)(const std::string& name);
  JobCallCommand(CLI::App& app, const std::string& name, const std::string& description,
                 const ConnectionOptions& connection, Call call)
      : JobCommand(app, name, description, connection), call_(call) {}

 protected:
  int RunWith(client::Client& client) override {
    auto answered = (client.*call_)(job());
    if (!answered.ok()) return Fail(answered.status());
    std::cout << (json() ? client::ToJson(*answered) : client::FormatJob(*answered));
    return kOk;
  }

 private:
  const Call call_;
};

class WatchCommand : public JobCommand {
 public:
  WatchCommand(CLI::App& app, const ConnectionOptions& connection)
      : JobCommand(app, "watch", "print progress until the job ends", connection) {}

 protected:
  int RunWith(client::Client& client) override {
    auto final_job = client.WatchJob(job(), [&](const v1::Job& event) {
      std::cout << (json() ? client::ToJson(event) : client::FormatProgressLine(event) + "\n") << std::flush;
    });
    if (!final_job.ok()) return Fail(final_job.status());
    return ExitForJob(*final_job);
  }
};

class DeleteCommand : public JobCommand {
 public:
  DeleteCommand(CLI::App& app, const ConnectionOptions& connection)
      : JobCommand(app, "delete", "delete a finished job, its artifacts and the blobs only it used", connection) {}

 protected:
  int RunWith(client::Client& client) override {
    auto deleted = client.DeleteJob(job());
    if (!deleted.ok()) return Fail(deleted.status());
    std::cout << (json() ? client::ToJson(*deleted)
                         : absl::StrCat("deleted ", deleted->name(), ": ", deleted->blobs_deleted(), " blob(s), ",
                                        deleted->bytes_freed(), " bytes freed\n"));
    return kOk;
  }
};

class ListCommand : public ServerCommand {
 public:
  ListCommand(CLI::App& app, const ConnectionOptions& connection)
      : ServerCommand(app, "list", "jobs, newest first", connection) {
    Bind(cli(), "--state", &state_, "STATE", "only jobs in this state")
        ->check(CLI::IsMember({"queued", "running", "succeeded", "failed", "cancelled"}, CLI::ignore_case));
    cli()->add_option("--page-size", page_size_, "jobs per page (1-500)")->check(CLI::Range(1, 500));
    cli()->add_option("--page-token", page_token_, "the page after a previous one")->type_name("T");
    AddLabelOption(cli(), &labels_, "only jobs with this label (repeatable: all of them)");
    AddJsonFlag(cli(), &json_);
  }

 protected:
  int RunWith(client::Client& client) override {
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    if (state_.given() && !v1::JobState_Parse(absl::AsciiStrToUpper(*state_), &state)) {
      return (std::cerr << "onnxopt: unknown state " << *state_ << "\n", kUsage);
    }
    auto page = client.ListJobs(state, page_size_, page_token_, LabelsFrom(labels_));
    if (!page.ok()) return Fail(page.status());
    if (json_) {
      std::cout << client::ToJson(*page);
      return kOk;
    }
    for (const auto& listed : page->jobs()) {
      std::cout << absl::StrFormat("%-26s %-40s %s\n", listed.name(), client::FormatProgressLine(listed),
                                   listed.model().display_name());
    }
    if (!page->next_page_token().empty()) std::cout << "next page: --page-token " << page->next_page_token() << "\n";
    return kOk;
  }

 private:
  Flag<std::string> state_;
  int page_size_ = 0;  // the server's default
  std::string page_token_;
  std::vector<std::string> labels_;
  bool json_ = false;
};

}  // namespace

std::unique_ptr<Command> NewStatusCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<JobCallCommand>(app, "status", "show a job", connection, &client::Client::GetJob);
}
std::unique_ptr<Command> NewWatchCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<WatchCommand>(app, connection);
}
std::unique_ptr<Command> NewCancelCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<JobCallCommand>(app, "cancel", "cancel a queued or running job", connection,
                                          &client::Client::CancelJob);
}
std::unique_ptr<Command> NewDeleteCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<DeleteCommand>(app, connection);
}
std::unique_ptr<Command> NewListCommand(CLI::App& app, const ConnectionOptions& connection) {
  return std::make_unique<ListCommand>(app, connection);
}

}  // namespace onnxopt::cli
