// The line protocol between onnxopt-server and an onnxopt-worker child, on the child's stdout:
//   progress <phase> <done> <total> <pass>      any number of times
//   external <location>                         --inspect only: an external data file the model names,
//                                               C-escaped
//   status <code> <reason> <message>            once, last; <code> is an absl::StatusCode number,
//                                               <reason> an ErrorReason number (failure.h) and
//                                               <message> valid UTF-8 on one line
// The worker also leaves report.pb (complete or partial) and the model files in its output folder.
// A child that exits without a status line crashed, and its job fails with WORKER_CRASHED.
#ifndef ONNXOPT_SERVER_WORKER_PROTOCOL_H_
#define ONNXOPT_SERVER_WORKER_PROTOCOL_H_

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optimizer/optimize.h"

namespace onnxopt::server {

std::string FormatProgress(Phase phase, int done, int total, const std::string& pass);
// The status line; the message is made valid UTF-8 and cut to kMaxStatusMessageBytes.
std::string FormatStatus(const absl::Status& status);
inline constexpr size_t kMaxStatusMessageBytes = 4096;
std::string FormatExternalData(const std::string& location);

struct WorkerLine {
  enum class Kind { kProgress, kStatus, kExternalData, kOther } kind = Kind::kOther;
  Phase phase = Phase::kLoading;
  int done = 0;
  int total = 0;
  std::string pass;
  absl::Status status;
  std::string text;  // kExternalData: the location
};
WorkerLine ParseWorkerLine(const std::string& line);

// The manifest of inputs supplied with a job, one line per tensor: "<sample>\t<input name>\t<file>",
// the file relative to the manifest's folder. Input names hold no tabs or line breaks (the server
// refuses those).
struct SuppliedInputFile {
  int sample = 0;
  std::string name;
  std::string file;
};
std::string FormatInputManifest(const std::vector<SuppliedInputFile>& files);
// Per input set, input name -> file; INVALID_ARGUMENT for a malformed manifest.
absl::StatusOr<std::vector<std::map<std::string, std::filesystem::path>>> ParseInputManifest(
    const std::string& text, const std::filesystem::path& folder);

// The files of a job's input folder with the SHA-256 each must have, one line per file:
// "<sha256>\t<file>", the file relative to the manifest's folder. Stored blobs are checked against it
// before a job uses them, so a blob altered on disk fails its job instead of being used.
struct FileDigest {
  std::string sha256;
  std::string file;
};
std::string FormatDigestManifest(const std::vector<FileDigest>& files);
absl::StatusOr<std::vector<FileDigest>> ParseDigestManifest(const std::string& text);
// DATA_LOSS (BLOB_CORRUPT) naming the first file under `folder` whose content no longer has its digest.
absl::Status VerifyDigests(const std::vector<FileDigest>& files, const std::filesystem::path& folder);

}  // namespace onnxopt::server

#endif  // ONNXOPT_SERVER_WORKER_PROTOCOL_H_
