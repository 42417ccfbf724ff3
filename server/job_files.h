// The files of a job: where its folders are under the data folder, the blobs it names, and the small
// file operations its stages share (staging a blob, writing a report, removing a folder).
//
//   <data>/jobs/<id>/output/        the published result (artifacts), renamed into place whole
//   <data>/jobs/<id>/attempt-<n>/   one attempt's input/, output/ and worker.log
//   <data>/jobs/<id>/worker.log     the last published attempt's worker log
//   <data>/sandbox/                 the folder model inspections run in
#ifndef ONNXOPT_SERVER_JOB_FILES_H_
#define ONNXOPT_SERVER_JOB_FILES_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "onnxopt/v1/report.pb.h"
#include "onnxopt/v1/service.pb.h"
#include "optimizer/result_files.h"
#include "server/blob_store.h"

namespace onnxopt::server {

class JobFolders {
 public:
  explicit JobFolders(std::filesystem::path data_dir) : data_dir_(std::move(data_dir)) {}
  std::filesystem::path Jobs() const { return data_dir_ / "jobs"; }
  // `job_name` is "jobs/<id>" (or "<id>").
  std::filesystem::path Job(const std::string& job_name) const;
  std::filesystem::path Output(const std::string& job_name) const { return Job(job_name) / "output"; }
  std::filesystem::path Attempt(const std::string& job_name, int attempt) const;
  std::filesystem::path Sandbox() const { return data_dir_ / "sandbox"; }

 private:
  std::filesystem::path data_dir_;
};

// The file names a job's staged input folder uses itself.
inline constexpr const char* kStagedModelName = kModelFileName;
inline constexpr char kDigestManifestName[] = "digests.tsv";
inline constexpr char kStagedInputsFolder[] = "inputs";

// The report as the worker wrote it (binary): what the server reads back, and the result cache copies.
inline constexpr char kReportProtoName[] = "report.pb";

// The blobs a job uses: its model, external data files and supplied inputs.
std::vector<std::string> BlobsOf(const v1::Job& job);
// NOT_FOUND (BLOB_NOT_FOUND) naming the first blob of `job` that is gone, `advice` after "was deleted".
absl::Status BlobsPresent(const v1::Job& job, const BlobStore& blobs, absl::string_view advice);

// Stages a blob as a job's file. Never writes through an existing file: staged files are hard links to
// blobs, so overwriting one would overwrite a stored blob.
absl::Status LinkOrCopy(const std::filesystem::path& from, const std::filesystem::path& to);
// report.json (what clients read) and report.pb (what the result cache copies), each written atomically.
absl::Status WriteReport(const v1::Report& report, const std::filesystem::path& dir);
// Removes a folder; the bytes it held.
int64_t RemoveFolder(const std::filesystem::path& folder);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_JOB_FILES_H_
