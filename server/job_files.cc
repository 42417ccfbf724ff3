#include "server/job_files.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"

namespace onnxopt::server {
namespace fs = std::filesystem;

fs::path JobFolders::Job(const std::string& job_name) const {
  return Jobs() / std::string(absl::StripPrefix(job_name, "jobs/"));
}

fs::path JobFolders::Attempt(const std::string& job_name, int attempt) const {
  return Job(job_name) / absl::StrCat("attempt-", attempt);
}

std::vector<std::string> BlobsOf(const v1::Job& job) {
  std::vector<std::string> digests = {job.model().sha256()};
  for (const auto& file : job.model().external_data()) digests.push_back(file.sha256());
  for (const auto& input : job.inputs()) digests.push_back(input.sha256());
  return digests;
}

absl::Status BlobsPresent(const v1::Job& job, const BlobStore& blobs, absl::string_view advice) {
  for (const std::string& digest : BlobsOf(job)) {
    if (!blobs.Exists(digest)) {
      return Failure(absl::StatusCode::kNotFound, v1::ErrorReason::BLOB_NOT_FOUND,
                     absl::StrCat("blob ", digest, " was deleted", advice));
    }
  }
  return absl::OkStatus();
}

absl::Status LinkOrCopy(const fs::path& from, const fs::path& to) {
  std::error_code error;
  fs::create_directories(to.parent_path(), error);
  if (fs::exists(fs::symlink_status(to, error))) {
    return absl::InternalError(absl::StrCat("cannot stage ", to.string(), ": a file of that name is already staged"));
  }
  fs::create_hard_link(from, to, error);
  if (error) fs::copy_file(from, to, fs::copy_options::none, error);
  if (error) return absl::InternalError(absl::StrCat("cannot stage ", to.string(), ": ", error.message()));
  return absl::OkStatus();
}

absl::Status WriteReport(const v1::Report& report, const fs::path& dir) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  auto status = google::protobuf::util::MessageToJsonString(report, &json, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  absl::Status written = WriteFileAtomically(dir / kReportFileName, json);
  if (!written.ok()) return written;
  return WriteFileAtomically(dir / kReportProtoName, report.SerializeAsString());
}

int64_t RemoveFolder(const fs::path& folder) {
  int64_t bytes = 0;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(folder, error); !error && it != fs::recursive_directory_iterator();
       it.increment(error)) {
    std::error_code ignored;
    if (it->is_regular_file(ignored)) bytes += static_cast<int64_t>(it->file_size(ignored));
  }
  std::error_code ignored;
  fs::remove_all(folder, ignored);
  return bytes;
}

}  // namespace onnxopt::server
