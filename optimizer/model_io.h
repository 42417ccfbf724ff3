// Loading and saving models, with external data handled by onnxopt's own code: onnx 1.12's loader is
// open to path traversal (CVE-2022-25882), so it is never asked to open files. External data is read
// only from regular files inside the model's folder, and written next to the model.
#ifndef ONNXOPT_OPTIMIZER_MODEL_IO_H_
#define ONNXOPT_OPTIMIZER_MODEL_IO_H_

#include <cstdint>
#include <filesystem>
#include <functional>
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

// Loads like LoadModel, except that external tensors of at least `min_bytes` stay where they are,
// "by reference": after the same confinement checks, their location becomes the resolved absolute
// path and their offset and length are checked against that file. The model then costs memory for
// its graph and small tensors only; a pass that needs such a tensor's values reads them with
// TensorBytes, and SaveModel copies them file to file. Absolute locations cannot come from a model
// itself (LoadModel refuses them), so an absolute location always means "resolved here".
inline constexpr int64_t kByReferenceMinBytes = 64 << 10;
absl::StatusOr<onnx::ModelProto> LoadModelByReference(const std::filesystem::path& path,
                                                       int64_t min_bytes = kByReferenceMinBytes);

// Whether the tensor's bytes are in a file LoadModelByReference resolved.
bool IsByReference(const onnx::TensorProto& tensor);
// The size of the tensor's data, wherever it lives (raw_data, typed fields, or by reference).
int64_t TensorDataBytes(const onnx::TensorProto& tensor);
// The tensor's raw bytes: &tensor.raw_data() when they are inline, else read into `scratch` (by
// reference) and &*scratch; nullptr when the tensor has no raw bytes (typed fields) or the read
// failed (`error` says why when given).
const std::string* RawBytes(const onnx::TensorProto& tensor, std::string* scratch, absl::Status* error = nullptr);
// Bytes [offset, offset + length) of the tensor's raw data, inline or by reference, into `out`.
absl::Status ReadTensorBytes(const onnx::TensorProto& tensor, int64_t offset, int64_t length, std::string* out);
// Whether two tensors of one data size hold the same raw bytes, inline or by reference (compared in
// chunks, so two large tensors by reference are never both held); false where one cannot be read.
bool SameTensorBytes(const onnx::TensorProto& a, const onnx::TensorProto& b);
// Pulls a by-reference tensor's bytes into raw_data; other tensors are left as they are.
absl::Status LoadTensorBytes(onnx::TensorProto* tensor);
// The same for every tensor of the model, subgraphs and functions included.
absl::Status LoadAllTensorBytes(onnx::ModelProto* model);

// The model's size on disk: its serialized size, tensors by reference counted at their data's size.
int64_t ModelBytes(const onnx::ModelProto& model);
// The opset the model imports for the default domain ("" or "ai.onnx"); 0 if none.
int64_t DefaultOpset(const onnx::ModelProto& model);
// Whether any tensor of the model is by reference.
bool HasTensorsByReference(const onnx::ModelProto& model);
// The model serialized for ONNX Runtime, which refuses absolute external locations: tensors by
// reference are pulled into a copy first (a model without any is serialized as it is).
absl::StatusOr<std::string> SerializeForRuntime(const onnx::ModelProto& model);

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
  // Models whose data would pass this, and models with tensors by reference, are saved with tensors
  // of at least `external_min_bytes` in "<model file name>.data" (tensors by reference are copied
  // there file to file, never held in memory). Protobuf cannot hold messages over 2 GiB.
  int64_t external_threshold_bytes = int64_t{1800} << 20;
  int64_t external_min_bytes = 1024;
  // Flushed to the disk before the rename (fsync): what a server that acknowledges the files needs.
  // A local command may leave that to the kernel, as cp does: 0.2 s of a 100k-node decoder's 95 MB.
  bool durable = true;
  // Tensors by reference keep their bytes where they are: each file they live in is hard-linked beside
  // the model (copied where no link can be made, e.g. across filesystems) and the tensors point into
  // the link. For scratch copies of a big model (RuntimeSource), which then cost only what was changed.
  bool link_by_reference = false;
};

// Writes the model (and its data file when needed) atomically: to temporary names, then renamed.
// Returns the files written: the model first, then its data file, then links (link_by_reference).
absl::StatusOr<std::vector<std::filesystem::path>> SaveModel(const onnx::ModelProto& model,
                                                             const std::filesystem::path& path,
                                                             const SaveOptions& options = {});

// Points the external data of the model file at `path` from `from` to `to` (a file name beside it),
// rewriting the model file atomically; the data file itself is the caller's to rename.
absl::Status RelocateExternalData(const std::filesystem::path& path, const std::string& from, const std::string& to);

// Rewrites the model file's small top-level fields (producer, metadata_props, opsets...) by `edit`,
// atomically, copying the graph, functions and training info byte for byte from the file: memory for
// the header only, whatever the model's size (a 1.8 GB single-file model cost 3.6 GB parsed and
// serialized again).
absl::Status RewriteModelHeader(const std::filesystem::path& path, const std::function<void(onnx::ModelProto*)>& edit);

// Writes bytes to `path` through a temporary file and a rename, so readers never see half a file.
absl::Status WriteFileAtomically(const std::filesystem::path& path, const std::string& bytes);
absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path);
// fsyncs the folder `dir` itself, so that names a rename or create put in it survive a crash (the files'
// own bytes need their own fsync first).
absl::Status SyncDirectory(const std::filesystem::path& dir);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_MODEL_IO_H_
