// A file of a job's result, where it was made or downloaded, with its role (report.proto's
// ArtifactRole): what delivery decides by. A served job's roles come from its artifacts; a local run's
// from the optimizer's one rule (ResultFileRole).
#ifndef ONNXOPT_CLIENT_RESULT_FILE_H_
#define ONNXOPT_CLIENT_RESULT_FILE_H_

#include <filesystem>
#include <vector>

#include "onnxopt/v1/report.pb.h"

namespace onnxopt::client {

struct ResultFile {
  std::filesystem::path path;
  v1::ArtifactRole role = v1::ARTIFACT_ROLE_UNSPECIFIED;
};

// The optimizer's output files (OptimizeResult.files, report.json) with their roles.
std::vector<ResultFile> LocalResultFiles(const std::vector<std::filesystem::path>& files);
// The first file of `role`, or null.
const ResultFile* FindRole(const std::vector<ResultFile>& files, v1::ArtifactRole role);

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_RESULT_FILE_H_
