#include "client/commands/delivery.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/commands/progress_line.h"
#include "client/report_html.h"
#include "optimizer/model_io.h"

namespace onnxopt::cli {
namespace fs = std::filesystem;
namespace {

using client::FindRole;
using client::ResultFile;

fs::path FolderOf(const fs::path& out) { return out.has_parent_path() ? out.parent_path() : fs::path("."); }

// Renames a result's files from where they were made to where their roles put them: the model to
// `out`, its data file to OUT.data (the model rewritten to say so), an extracted adapter to
// OUT-without-extension.onnx_adapter so that results in one folder do not clash, other files beside
// `out` under their own names.
absl::Status MoveResult(const std::vector<ResultFile>& files, const fs::path& out) {
  const fs::path dir = FolderOf(out);
  const std::string data_name = out.filename().string() + ".data";
  const ResultFile* data = FindRole(files, v1::ARTIFACT_MODEL_DATA);
  std::error_code error;
  for (const ResultFile& file : files) {
    switch (file.role) {
      case v1::ARTIFACT_MODEL:
        if (data != nullptr) {
          absl::Status relocated = RelocateExternalData(file.path, data->path.filename().string(), data_name);
          if (!relocated.ok()) return relocated;
        }
        fs::rename(file.path, out, error);
        break;
      case v1::ARTIFACT_MODEL_DATA:
        fs::rename(file.path, dir / data_name, error);
        break;
      case v1::ARTIFACT_ADAPTER:  // OUT.onnx_adapter, as ONNX Runtime GenAI names them
        fs::rename(file.path, dir / (out.stem().string() + ".onnx_adapter"), error);
        break;
      default:
        fs::rename(file.path, dir / file.path.filename(), error);
    }
    if (error) return absl::InternalError(absl::StrCat("cannot move ", file.path.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Delivered> DeliverToRepository(const std::vector<ResultFile>& files, const v1::Report& report,
                                              const Destination& to) {
  std::vector<std::string> notes;
  auto written = client::WriteModelRepository(files, report, *to.repository, to.out, &notes);
  if (!written.ok()) return written.status();
  for (const std::string& note : notes) std::cerr << "genai_config.json: " << note << std::endl;
  if (to.repository->layout == client::RepositoryLayout::kGenai) return Delivered{to.out, to.out / "onnxopt_report.json"};
  return Delivered{to.out, to.out / to.repository->model_name / "onnxopt_report.json"};
}

}  // namespace

absl::StatusOr<Delivered> Deliver(std::vector<ResultFile> files, const v1::Report& report, const Destination& to) {
  if (to.repository) return DeliverToRepository(files, report, to);
  fs::path report_path = to.out;
  report_path += ".report.json";
  auto report_file =
      std::find_if(files.begin(), files.end(), [](const ResultFile& f) { return f.role == v1::ARTIFACT_REPORT; });
  if (report_file != files.end()) {
    std::error_code error;
    fs::rename(report_file->path, report_path, error);
    if (error) return absl::InternalError(absl::StrCat("cannot write ", report_path.string(), ": ", error.message()));
    files.erase(report_file);
  }
  if (absl::Status moved = MoveResult(files, to.out); !moved.ok()) return moved;
  return Delivered{to.out, report_path};
}

fs::path WorkFolder(const Destination& to) {
  const bool inside = to.repository && to.repository->layout != client::RepositoryLayout::kGenai;
  return inside ? to.out : FolderOf(to.out);
}

absl::StatusOr<Delivered> DownloadResult(client::Client& client, const v1::Job& job, const Destination& to) {
  const fs::path dir = WorkFolder(to);
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

void PrintDelivered(const Destination& to, const Delivered& delivered) {
  const char* label = !to.repository                                          ? "optimized model: "
                      : to.repository->layout == client::RepositoryLayout::kGenai ? "genai folder:    "
                                                                                  : "model repository: ";
  std::cout << label << delivered.where.string() << "\nreport:          " << delivered.report.string() << std::endl;
}

absl::Status WriteHtml(const v1::Report& report, const fs::path& path) {
  if (path.empty()) return absl::InvalidArgumentError("--html needs a file name");
  return WriteFileAtomically(path, client::RenderReportHtml(report));
}

}  // namespace onnxopt::cli
