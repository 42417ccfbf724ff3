#include "client/result_file.h"

#include "optimizer/result_files.h"

namespace onnxopt::client {

std::vector<ResultFile> LocalResultFiles(const std::vector<std::filesystem::path>& files) {
  std::vector<ResultFile> typed;
  for (const auto& file : files) typed.push_back({file, ResultFileRole(file.filename().string())});
  return typed;
}

const ResultFile* FindRole(const std::vector<ResultFile>& files, v1::ArtifactRole role) {
  for (const ResultFile& file : files) {
    if (file.role == role) return &file;
  }
  return nullptr;
}

}  // namespace onnxopt::client
