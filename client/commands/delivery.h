// Where a result's files go once they are on this machine (a finished job's artifacts, or a local
// optimize's output): a model file with its data and report beside it, or a model repository.
#ifndef ONNXOPT_CLIENT_COMMANDS_DELIVERY_H_
#define ONNXOPT_CLIENT_COMMANDS_DELIVERY_H_

#include <filesystem>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/model_repository.h"
#include "client/result_file.h"
#include "onnxopt/v1/report.pb.h"

namespace onnxopt::cli {

// A model file (`out`, its data file and report beside it) or, with a layout, a model repository (or
// GenAI folder) at `out`.
struct Destination {
  std::filesystem::path out;
  std::optional<client::RepositoryOptions> repository;
};

// What a delivery made: the model (or the repository) and the report.
struct Delivered {
  std::filesystem::path where;
  std::filesystem::path report;
};

// Where a result's files gather before they are delivered to `to`: inside a model repository, beside a
// model file or a GenAI folder (which appears whole).
std::filesystem::path WorkFolder(const Destination& to);

// Moves a result's files (the model, its data, the report, ...) to `to`, each where its role puts it.
absl::StatusOr<Delivered> Deliver(std::vector<client::ResultFile> files, const v1::Report& report,
                                  const Destination& to);

// Downloads every artifact of the finished `job` and delivers them to `to`. The files gather in a
// folder named after the job beside the destination, each resumable (Client::Download), so an
// interrupted run's bytes are not fetched again; the folder goes once everything is delivered.
absl::StatusOr<Delivered> DownloadResult(client::Client& client, const v1::Job& job, const Destination& to);

// The two lines that say where a delivery went ("optimized model: ..." or the repository, and the report).
void PrintDelivered(const Destination& to, const Delivered& delivered);

// Writes the report as one self-contained HTML page at `path` (--html FILE).
absl::Status WriteHtml(const v1::Report& report, const std::filesystem::path& path);

}  // namespace onnxopt::cli

#endif  // ONNXOPT_CLIENT_COMMANDS_DELIVERY_H_
