// Loading and saving models, with external data handled by onnxopt's own code: onnx 1.12's loader is
// open to path traversal (CVE-2022-25882), so it is never asked to open files. External data is read
// only from regular files inside the model's folder, and written next to the model.
#ifndef ONNXOPT_OPTIMIZER_MODEL_IO_H_
#define ONNXOPT_OPTIMIZER_MODEL_IO_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"

namespace onnxopt {

// Parses serialized model bytes. INVALID_ARGUMENT (reason MODEL_PARSE_FAILED) if they are not a model.
absl::StatusOr<onnx::ModelProto> ParseModel(const std::string& bytes);

// Parses a model file as it streams in, so that bytes that are no model fail at once, and the file is
// never held twice in memory. Its external data is not read.
absl::StatusOr<onnx::ModelProto> ParseModelFile(const std::filesystem::path& path);

// Reads `path` and pulls every external tensor's bytes into the model (the model then stands alone).
// External files must be relative names under the model's folder; anything else is INVALID_ARGUMENT.
absl::StatusOr<onnx::ModelProto> LoadModel(const std::filesystem::path& path);

// Names of the external data files a model references (without loading them): every tensor's, dense
// and sparse, initializer or attribute, in subgraphs, functions and training graphs alike.
std::vector<std::string> ExternalDataLocations(const onnx::ModelProto& model);

// INVALID_ARGUMENT (MODEL_UNSUPPORTED) if the model holds tensors in a place this onnx version cannot
// see (function attribute defaults of IR 9), so ExternalDataLocations could not vouch for them.
absl::Status CheckTensorsVisible(const onnx::ModelProto& model);

// The file an external data location names, if it is a plain relative path to a regular file inside
// `folder`, also after symbolic links are resolved; INVALID_ARGUMENT (EXTERNAL_DATA_PATH or
// EXTERNAL_DATA_MISSING) otherwise.
absl::StatusOr<std::filesystem::path> ResolveExternalDataPath(const std::filesystem::path& folder,
                                                              const std::string& location);

struct SaveOptions {
  // Models whose serialized size would pass this are saved with tensors of at least
  // `external_min_bytes` in "<model file name>.data". Protobuf cannot hold messages over 2 GiB.
  int64_t external_threshold_bytes = int64_t{1800} << 20;
  int64_t external_min_bytes = 1024;
};

// Writes the model (and its data file when needed) atomically: to temporary names, then renamed.
// Returns the files written, model first.
absl::StatusOr<std::vector<std::filesystem::path>> SaveModel(onnx::ModelProto model, const std::filesystem::path& path,
                                                             const SaveOptions& options = {});

// Writes bytes to `path` through a temporary file and a rename, so readers never see half a file.
absl::Status WriteFileAtomically(const std::filesystem::path& path, const std::string& bytes);
absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_MODEL_IO_H_
