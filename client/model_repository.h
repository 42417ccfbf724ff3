// Deployable output: a job's model as a model repository a server loads as it is.
//   triton: REPO/<name>/config.pbtxt and REPO/<name>/<version>/model.onnx (+ its data file), as Triton
//           Inference Server (and Model Navigator) lay it out.
//   kserve: the same repository plus REPO/inferenceservice.yaml, a KServe InferenceService that serves
//           it with the Triton runtime from `storage_uri`.
//   genai:  a folder ONNX Runtime GenAI loads: model.onnx, genai_config.json and the tokenizer's files
//           (client/genai_config.h); no model name or versions.
// config.pbtxt comes from the graph's inputs and outputs (types, dims, max_batch_size where the batch
// dim is dynamic), backend onnxruntime with the session settings the benchmark found fastest, and the
// ONNX Runtime version the model needs at least (the fused operators' contrib kernels).
#ifndef ONNXOPT_CLIENT_MODEL_REPOSITORY_H_
#define ONNXOPT_CLIENT_MODEL_REPOSITORY_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "client/result_file.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/genai_config.h"
#include "onnx/onnx_pb.h"
#include "onnxopt/v1/report.pb.h"

namespace onnxopt::client {

enum class RepositoryLayout { kTriton, kKServe, kGenai };
absl::StatusOr<RepositoryLayout> ParseRepositoryLayout(const std::string& name);

struct RepositoryOptions {
  RepositoryLayout layout = RepositoryLayout::kTriton;
  std::string model_name;   // 1-128 of A-Z a-z 0-9 - _ . (a folder and a URL path segment)
  int64_t version = 1;      // >= 1
  int max_batch_size = 8;   // used where the batch dim is dynamic
  std::string storage_uri;  // kserve: where the repository will be (default pvc://onnxopt-models/<name>)
  GenaiOptions genai;       // genai only
};

// Checks the name and version before anything is downloaded.
absl::Status CheckRepositoryOptions(const RepositoryOptions& options);

// ALREADY_EXISTS (REPOSITORY_VERSION_EXISTS) when `repo` holds the version already (genai:
// GENAI_FOLDER_EXISTS when the folder is not empty): checked before a job runs or a byte is
// downloaded, and again when the repository is written.
absl::Status CheckVersionFree(const RepositoryOptions& options, const std::filesystem::path& repo);

// Whether the model at `model_path` (its graph) can be delivered in `options`' layout: Triton has
// types for its inputs and outputs; GenAI can drive it and knows its context length. Checked before a
// job runs; a model that cannot be read passes here (the job says why), and so does one whose .onnx
// holds over 256 MiB of weights (checked again on delivery, as every model is).
absl::Status CheckModelFitsLayout(const std::filesystem::path& model_path, const RepositoryOptions& options);

// Triton's config.pbtxt for `model`, whose session settings are those of `report`.
std::string TritonModelConfig(const onnx::ModelProto& model, const v1::Report& report, const std::string& name,
                              int max_batch_size);

// Moves `files` (the downloaded result: model.onnx, its model.onnx.data, the adapter, ...) into the
// repository at `repo` and writes config.pbtxt (and the KServe manifest). An existing version folder
// is refused (ALREADY_EXISTS): a repository's versions are immutable once served. Returns the paths
// written; `notes` (genai) receives how genai_config.json's figures that the graph does not hold were found.
absl::StatusOr<std::vector<std::filesystem::path>> WriteModelRepository(const std::vector<ResultFile>& files,
                                                                        const v1::Report& report,
                                                                        const RepositoryOptions& options,
                                                                        const std::filesystem::path& repo,
                                                                        std::vector<std::string>* notes = nullptr);

}  // namespace onnxopt::client

#endif  // ONNXOPT_CLIENT_MODEL_REPOSITORY_H_
