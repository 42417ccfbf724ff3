#include "optimizer/model_io.h"

#include <fcntl.h>
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
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace onnxopt {
namespace fs = std::filesystem;
namespace {

// Calls fn on every tensor a model holds: initializers and tensor attributes, in all subgraphs.
void ForEachTensor(onnx::GraphProto* graph, const std::function<void(onnx::TensorProto*)>& fn) {
  for (auto& tensor : *graph->mutable_initializer()) fn(&tensor);
  for (auto& node : *graph->mutable_node()) {
    for (auto& attribute : *node.mutable_attribute()) {
      if (attribute.has_t()) fn(attribute.mutable_t());
      for (auto& tensor : *attribute.mutable_tensors()) fn(&tensor);
      if (attribute.has_g()) ForEachTensor(attribute.mutable_g(), fn);
      for (auto& subgraph : *attribute.mutable_graphs()) ForEachTensor(&subgraph, fn);
    }
  }
}

std::string ExternalField(const onnx::TensorProto& tensor, const std::string& key) {
  for (const auto& entry : tensor.external_data()) {
    if (entry.key() == key) return entry.value();
  }
  return "";
}

// A location is acceptable if it is a plain relative path that stays inside `folder`, also after
// symbolic links are resolved.
absl::StatusOr<fs::path> ConfinedPath(const fs::path& folder, const std::string& location) {
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

absl::StatusOr<onnx::ModelProto> ParseModel(const std::string& bytes) {
  onnx::ModelProto model;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) || !model.ParseFromCodedStream(&coded) ||
      !coded.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError("MODEL_PARSE_FAILED: the file is not a serialized ONNX ModelProto");
  }
  if (!model.has_graph()) return absl::InvalidArgumentError("MODEL_PARSE_FAILED: the model has no graph");
  if (model.ir_version() <= 0) return absl::InvalidArgumentError("MODEL_PARSE_FAILED: the model has no ir_version");
  return model;
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return bytes;
}

std::vector<std::string> ExternalDataLocations(const onnx::ModelProto& model) {
  std::set<std::string> locations;
  // ForEachTensor only reaches mutable accessors of fields that are set, and the visitor only reads.
  ForEachTensor(const_cast<onnx::GraphProto*>(&model.graph()), [&](onnx::TensorProto* tensor) {
    if (tensor->data_location() == onnx::TensorProto::EXTERNAL) locations.insert(ExternalField(*tensor, "location"));
  });
  return {locations.begin(), locations.end()};
}

absl::StatusOr<onnx::ModelProto> LoadModel(const fs::path& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<onnx::ModelProto> model = ParseModel(*bytes);
  if (!model.ok()) return model.status();
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  absl::Status status = absl::OkStatus();
  ForEachTensor(model->mutable_graph(), [&](onnx::TensorProto* tensor) {
    if (!status.ok() || tensor->data_location() != onnx::TensorProto::EXTERNAL) return;
    absl::StatusOr<fs::path> file = ConfinedPath(folder, ExternalField(*tensor, "location"));
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

absl::Status WriteFileAtomically(const fs::path& path, const std::string& bytes) {
  const fs::path temporary = path.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", temporary.string(), ": ", std::strerror(errno)));
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = std::strerror(errno);
      ::close(fd);
      ::unlink(temporary.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", temporary.string(), ": ", reason));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot flush ", temporary.string()));
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
    ForEachTensor(model.mutable_graph(), [&](onnx::TensorProto* tensor) {
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
