#include "optimizer/model_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace onnxopt {
namespace fs = std::filesystem;
namespace {

// Where a tensor sits: its bytes may be external in every case, and a loader that skips a case lets
// ONNX Runtime resolve that location on its own, relative to whatever folder it likes.
enum class TensorKind { kDense, kSparsePart };
using TensorVisitor = std::function<void(onnx::TensorProto*, TensorKind)>;

void ForEachTensorIn(onnx::GraphProto* graph, const TensorVisitor& fn);

void ForEachSparse(onnx::SparseTensorProto* sparse, const TensorVisitor& fn) {
  if (sparse->has_values()) fn(sparse->mutable_values(), TensorKind::kSparsePart);
  if (sparse->has_indices()) fn(sparse->mutable_indices(), TensorKind::kSparsePart);
}

void ForEachTensorInNodes(google::protobuf::RepeatedPtrField<onnx::NodeProto>* nodes, const TensorVisitor& fn) {
  for (auto& node : *nodes) {
    for (auto& attribute : *node.mutable_attribute()) {
      if (attribute.has_t()) fn(attribute.mutable_t(), TensorKind::kDense);
      for (auto& tensor : *attribute.mutable_tensors()) fn(&tensor, TensorKind::kDense);
      if (attribute.has_sparse_tensor()) ForEachSparse(attribute.mutable_sparse_tensor(), fn);
      for (auto& sparse : *attribute.mutable_sparse_tensors()) ForEachSparse(&sparse, fn);
      if (attribute.has_g()) ForEachTensorIn(attribute.mutable_g(), fn);
      for (auto& subgraph : *attribute.mutable_graphs()) ForEachTensorIn(&subgraph, fn);
    }
  }
}

void ForEachTensorIn(onnx::GraphProto* graph, const TensorVisitor& fn) {
  for (auto& tensor : *graph->mutable_initializer()) fn(&tensor, TensorKind::kDense);
  for (auto& sparse : *graph->mutable_sparse_initializer()) ForEachSparse(&sparse, fn);
  ForEachTensorInNodes(graph->mutable_node(), fn);
}

// Calls fn on every tensor a model holds: dense and sparse initializers, tensor attributes (Constant
// values, sparse ones too), in the graph, its subgraphs, the model's functions and training graphs.
void ForEachTensor(onnx::ModelProto* model, const TensorVisitor& fn) {
  if (model->has_graph()) ForEachTensorIn(model->mutable_graph(), fn);
  for (auto& function : *model->mutable_functions()) ForEachTensorInNodes(function.mutable_node(), fn);
  for (auto& training : *model->mutable_training_info()) {
    if (training.has_initialization()) ForEachTensorIn(training.mutable_initialization(), fn);
    if (training.has_algorithm()) ForEachTensorIn(training.mutable_algorithm(), fn);
  }
}

std::string ExternalField(const onnx::TensorProto& tensor, const std::string& key) {
  for (const auto& entry : tensor.external_data()) {
    if (entry.key() == key) return entry.value();
  }
  return "";
}

}  // namespace

absl::StatusOr<fs::path> ResolveExternalDataPath(const fs::path& folder, const std::string& location) {
  const fs::path relative(location);
  if (location.empty() || relative.is_absolute() || location.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_PATH: bad external data location '", location, "'"));
  }
  for (const auto& part : relative) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_PATH: external data location '", location,
                                                     "' leaves the model's folder"));
    }
  }
  std::error_code error;
  const fs::path root = fs::canonical(folder, error);
  if (error) return absl::NotFoundError(absl::StrCat("model folder ", folder.string(), ": ", error.message()));
  const fs::path resolved = fs::canonical(root / relative, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_MISSING: external data file '", location,
                                                   "' not found next to the model"));
  }
  const std::string root_text = root.string() + "/";
  if (resolved.string().compare(0, root_text.size(), root_text) != 0 || !fs::is_regular_file(resolved)) {
    return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_PATH: external data location '", location,
                                                   "' is not a regular file inside the model's folder"));
  }
  return resolved;
}

namespace {

absl::Status ReadRange(const fs::path& path, int64_t offset, int64_t length, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  if (length < 0) length = size - offset;
  if (offset < 0 || length < 0 || offset + length > size) {
    return absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_RANGE: offset ", offset, " + length ", length,
                                                   " is outside ", path.filename().string(), " (", size, " bytes)"));
  }
  out->resize(static_cast<size_t>(length));
  in.seekg(offset);
  in.read(out->data(), length);
  if (!in) return absl::DataLossError(absl::StrCat("short read from ", path.string()));
  return absl::OkStatus();
}

}  // namespace

namespace {

// Parses from any stream; MODEL_PARSE_FAILED unless it holds exactly one ModelProto with a graph.
absl::StatusOr<onnx::ModelProto> ParseModelFrom(google::protobuf::io::ZeroCopyInputStream* raw) {
  onnx::ModelProto model;
  google::protobuf::io::CodedInputStream coded(raw);
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  if (!model.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError("MODEL_PARSE_FAILED: the file is not a serialized ONNX ModelProto");
  }
  if (!model.has_graph()) return absl::InvalidArgumentError("MODEL_PARSE_FAILED: the model has no graph");
  if (model.ir_version() <= 0) return absl::InvalidArgumentError("MODEL_PARSE_FAILED: the model has no ir_version");
  return model;
}

}  // namespace

absl::StatusOr<onnx::ModelProto> ParseModel(const std::string& bytes) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError("MODEL_PARSE_FAILED: the file is not a serialized ONNX ModelProto");
  }
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
  return ParseModelFrom(&raw);
}

absl::StatusOr<onnx::ModelProto> ParseModelFile(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path.string(), ": ", std::strerror(errno)));
  struct stat info;
  if (::fstat(fd, &info) != 0 || info.st_size > std::numeric_limits<int>::max()) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("MODEL_PARSE_FAILED: ", path.filename().string(),
                                                   " is over the 2 GiB a serialized ModelProto can be"));
  }
  google::protobuf::io::FileInputStream raw(fd);
  raw.SetCloseOnDelete(true);
  absl::StatusOr<onnx::ModelProto> model = ParseModelFrom(&raw);
  if (raw.GetErrno() != 0) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return model;
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return bytes;
}

absl::Status CheckTensorsVisible(const onnx::ModelProto& model) {
  // FunctionProto.attribute_proto (field 11, IR 9) holds attribute defaults, tensors among them, that
  // onnx 1.12 keeps as unknown bytes: neither checked nor loaded here, yet ONNX Runtime reads them.
  constexpr int kFunctionAttributeProto = 11;
  for (const auto& function : model.functions()) {
    const auto& unknown = function.GetReflection()->GetUnknownFields(function);
    for (int i = 0; i < unknown.field_count(); ++i) {
      if (unknown.field(i).number() == kFunctionAttributeProto) {
        return absl::InvalidArgumentError(absl::StrCat(
            "MODEL_UNSUPPORTED: function '", function.name(),
            "' declares attribute defaults (ONNX IR 9), which this onnxopt cannot read or check"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ExternalDataLocations(const onnx::ModelProto& model) {
  std::set<std::string> locations;
  // ForEachTensor only reaches mutable accessors of fields that are set, and the visitor only reads.
  ForEachTensor(const_cast<onnx::ModelProto*>(&model), [&](onnx::TensorProto* tensor, TensorKind) {
    if (tensor->data_location() == onnx::TensorProto::EXTERNAL) locations.insert(ExternalField(*tensor, "location"));
  });
  return {locations.begin(), locations.end()};
}

absl::StatusOr<onnx::ModelProto> LoadModel(const fs::path& path) {
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(path);
  if (!model.ok()) return model.status();
  if (absl::Status visible = CheckTensorsVisible(*model); !visible.ok()) return visible;
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  absl::Status status = absl::OkStatus();
  ForEachTensor(&*model, [&](onnx::TensorProto* tensor, TensorKind) {
    if (!status.ok() || tensor->data_location() != onnx::TensorProto::EXTERNAL) return;
    absl::StatusOr<fs::path> file = ResolveExternalDataPath(folder, ExternalField(*tensor, "location"));
    if (!file.ok()) {
      status = file.status();
      return;
    }
    int64_t offset = 0, length = -1;
    const std::string offset_text = ExternalField(*tensor, "offset");
    const std::string length_text = ExternalField(*tensor, "length");
    if ((!offset_text.empty() && !absl::SimpleAtoi(offset_text, &offset)) ||
        (!length_text.empty() && !absl::SimpleAtoi(length_text, &length))) {
      status = absl::InvalidArgumentError(absl::StrCat("EXTERNAL_DATA_RANGE: tensor '", tensor->name(),
                                                       "' has a malformed offset or length"));
      return;
    }
    status = ReadRange(*file, offset, length, tensor->mutable_raw_data());
    tensor->clear_external_data();
    tensor->set_data_location(onnx::TensorProto::DEFAULT);
  });
  if (!status.ok()) return status;
  return model;
}

namespace {

// A write that failed for want of space is RESOURCE_EXHAUSTED (DISK_FULL), anything else INTERNAL.
absl::Status WriteError(int error, const std::string& what) {
  if (error == ENOSPC || error == EDQUOT) {
    return absl::ResourceExhaustedError(absl::StrCat("DISK_FULL: ", what, ": ", std::strerror(error)));
  }
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(error)));
}

}  // namespace

absl::Status WriteFileAtomically(const fs::path& path, const std::string& bytes) {
  const fs::path temporary = path.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return WriteError(errno, absl::StrCat("cannot create ", temporary.string()));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      return WriteError(error, absl::StrCat("cannot write ", temporary.string()));
    }
    written += static_cast<size_t>(n);
  }
  int error = ::fsync(fd) != 0 ? errno : 0;
  if (::close(fd) != 0 && error == 0) error = errno;  // closed whatever fsync said
  if (error != 0) {
    ::unlink(temporary.c_str());
    return WriteError(error, absl::StrCat("cannot flush ", temporary.string()));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    ::unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot rename to ", path.string(), ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<fs::path>> SaveModel(onnx::ModelProto model, const fs::path& path,
                                                const SaveOptions& options) {
  std::vector<fs::path> written;
  if (static_cast<int64_t>(model.ByteSizeLong()) > options.external_threshold_bytes) {
    const std::string data_name = path.filename().string() + ".data";
    std::string data;
    ForEachTensor(&model, [&](onnx::TensorProto* tensor, TensorKind kind) {
      // Sparse parts stay inline: runtimes densify them at load and need not read them from files.
      if (kind != TensorKind::kDense) return;
      if (static_cast<int64_t>(tensor->raw_data().size()) < options.external_min_bytes) return;
      const size_t padding = (4096 - data.size() % 4096) % 4096;  // page-aligned, so runtimes can mmap
      data.append(padding, '\0');
      const int64_t offset = static_cast<int64_t>(data.size());
      data.append(tensor->raw_data());
      auto add = [&](const std::string& key, const std::string& value) {
        auto* entry = tensor->add_external_data();
        entry->set_key(key);
        entry->set_value(value);
      };
      add("location", data_name);
      add("offset", std::to_string(offset));
      add("length", std::to_string(tensor->raw_data().size()));
      tensor->clear_raw_data();
      tensor->set_data_location(onnx::TensorProto::EXTERNAL);
    });
    const fs::path data_path = path.parent_path() / data_name;
    absl::Status status = WriteFileAtomically(data_path, data);
    if (!status.ok()) return status;
    written.push_back(data_path);
  }
  std::string bytes;
  if (model.ByteSizeLong() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !model.SerializeToString(&bytes)) {
    return absl::InvalidArgumentError("MODEL_TOO_LARGE: the model does not fit a protobuf message even with "
                                      "external data");
  }
  absl::Status status = WriteFileAtomically(path, bytes);
  if (!status.ok()) return status;
  written.insert(written.begin(), path);
  return written;
}

}  // namespace onnxopt
