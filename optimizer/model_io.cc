#include "optimizer/model_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/unknown_field_set.h"
#include "optimizer/failure.h"

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
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_PATH,
                   absl::StrCat("bad external data location '", location, "'"));
  }
  for (const auto& part : relative) {
    if (part == "..") {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_PATH,
                     absl::StrCat("external data location '", location, "' leaves the model's folder"));
    }
  }
  std::error_code error;
  const fs::path root = fs::canonical(folder, error);
  if (error) return absl::NotFoundError(absl::StrCat("model folder ", folder.string(), ": ", error.message()));
  const fs::path resolved = fs::canonical(root / relative, error);
  if (error) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_MISSING,
                   absl::StrCat("external data file '", location, "' not found next to the model"));
  }
  const std::string root_text = root.string() + "/";
  if (resolved.string().compare(0, root_text.size(), root_text) != 0 || !fs::is_regular_file(resolved)) {
    return Failure(
        absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_PATH,
        absl::StrCat("external data location '", location, "' is not a regular file inside the model's folder"));
  }
  return resolved;
}

namespace {

// Parses from any stream; MODEL_PARSE_FAILED unless it holds exactly one ModelProto with a graph.
absl::StatusOr<onnx::ModelProto> ParseModelFrom(google::protobuf::io::ZeroCopyInputStream* raw) {
  onnx::ModelProto model;
  google::protobuf::io::CodedInputStream coded(raw);
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  if (!model.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED,
                   "the file is not a serialized ONNX ModelProto");
  }
  if (!model.has_graph()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED, "the model has no graph");
  }
  if (model.ir_version() <= 0) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED,
                   "the model has no ir_version");
  }
  return model;
}

}  // namespace

absl::StatusOr<onnx::ModelProto> ParseModel(const std::string& bytes) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED,
                   "the file is not a serialized ONNX ModelProto");
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
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_PARSE_FAILED,
                   absl::StrCat(path.filename().string(), " is over the 2 GiB a serialized ModelProto can be"));
  }
  // Read in 1 MiB blocks rather than the default 8 KiB: 13k reads fewer for a 100 MB model, 5% of
  // its parse.
  constexpr int kReadBlockBytes = 1 << 20;
  google::protobuf::io::FileInputStream raw(fd, kReadBlockBytes);
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
        return Failure(
            absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_UNSUPPORTED,
            absl::StrCat("function '", function.name(),
                         "' declares attribute defaults (ONNX IR 9), which this onnxopt cannot read or check"));
      }
    }
  }
  return absl::OkStatus();
}

bool HasTensorsByReference(const onnx::ModelProto& model) {
  bool found = false;
  // ForEachTensor only reaches mutable accessors of fields that are set, and the visitor only reads.
  ForEachTensor(const_cast<onnx::ModelProto*>(&model), [&](onnx::TensorProto* tensor, TensorKind) {
    found = found || IsByReference(*tensor);
  });
  return found;
}

int64_t DefaultOpset(const onnx::ModelProto& model) {
  for (const auto& opset : model.opset_import()) {
    if (opset.domain().empty() || opset.domain() == "ai.onnx") return opset.version();
  }
  return 0;
}

int64_t ModelBytes(const onnx::ModelProto& model) {
  int64_t bytes = static_cast<int64_t>(model.ByteSizeLong());
  ForEachTensor(const_cast<onnx::ModelProto*>(&model), [&](onnx::TensorProto* tensor, TensorKind) {
    if (IsByReference(*tensor)) bytes += TensorDataBytes(*tensor);
  });
  return bytes;
}

absl::StatusOr<std::string> SerializeForRuntime(const onnx::ModelProto& model) {
  if (!HasTensorsByReference(model)) return model.SerializeAsString();
  onnx::ModelProto copy = model;
  absl::Status loaded = LoadAllTensorBytes(&copy);
  if (!loaded.ok()) return loaded;
  return copy.SerializeAsString();
}

std::vector<std::string> ExternalDataLocations(const onnx::ModelProto& model) {
  std::set<std::string> locations;
  // ForEachTensor only reaches mutable accessors of fields that are set, and the visitor only reads.
  ForEachTensor(const_cast<onnx::ModelProto*>(&model), [&](onnx::TensorProto* tensor, TensorKind) {
    if (tensor->data_location() == onnx::TensorProto::EXTERNAL) locations.insert(ExternalField(*tensor, "location"));
  });
  return {locations.begin(), locations.end()};
}

namespace {

struct ExternalRange {
  fs::path file;
  int64_t offset = 0;
  int64_t length = 0;
};

// Resolves a tensor's external location, offset and length against `folder`, checking the range
// against the file's size (cached per file in `sizes`).
absl::StatusOr<ExternalRange> ResolveExternalRange(const fs::path& folder, const onnx::TensorProto& tensor,
                                                   std::map<fs::path, int64_t>* sizes) {
  absl::StatusOr<fs::path> file = ResolveExternalDataPath(folder, ExternalField(tensor, "location"));
  if (!file.ok()) return file.status();
  ExternalRange range{*file, 0, -1};
  const std::string offset_text = ExternalField(tensor, "offset");
  const std::string length_text = ExternalField(tensor, "length");
  if ((!offset_text.empty() && !absl::SimpleAtoi(offset_text, &range.offset)) ||
      (!length_text.empty() && !absl::SimpleAtoi(length_text, &range.length))) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_RANGE,
                   absl::StrCat("tensor '", tensor.name(), "' has a malformed offset or length"));
  }
  auto known = sizes->find(*file);
  if (known == sizes->end()) {
    std::error_code error;
    const auto size = fs::file_size(*file, error);
    if (error) return absl::NotFoundError(absl::StrCat("cannot stat ", file->string()));
    known = sizes->emplace(*file, static_cast<int64_t>(size)).first;
  }
  const int64_t size = known->second;
  if (range.length < 0 && range.offset >= 0) range.length = size - range.offset;
  if (range.offset < 0 || range.length < 0 || range.offset > size || range.length > size - range.offset) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::EXTERNAL_DATA_RANGE,
                   absl::StrCat("offset ", range.offset, " + length ", range.length, " is outside ",
                                file->filename().string(), " (", size, " bytes)"));
  }
  return range;
}

void SetExternalEntries(onnx::TensorProto* tensor, const std::string& location, int64_t offset, int64_t length) {
  tensor->clear_external_data();
  auto add = [&](const std::string& key, const std::string& value) {
    auto* entry = tensor->add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  add("length", std::to_string(length));
  tensor->clear_raw_data();
  tensor->set_data_location(onnx::TensorProto::EXTERNAL);
}

absl::Status PreadAll(int fd, int64_t offset, int64_t length, char* out, const std::string& what) {
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, out + done, static_cast<size_t>(length - done), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::DataLossError(absl::StrCat("short read from ", what));
    done += n;
  }
  return absl::OkStatus();
}

// Reads bytes [offset, offset + length) of `path`, a range already checked against its size.
absl::Status ReadFileRange(const std::string& path, int64_t offset, int64_t length, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::DataLossError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  out->resize(static_cast<size_t>(length));
  absl::Status status = PreadAll(fd, offset, length, out->data(), path);
  ::close(fd);
  return status;
}

// Where a by-reference tensor's bytes start in its file.
absl::StatusOr<int64_t> ByReferenceOffset(const onnx::TensorProto& tensor) {
  int64_t offset = 0;
  if (!absl::SimpleAtoi(ExternalField(tensor, "offset"), &offset) || offset < 0) {
    return absl::InternalError(absl::StrCat("tensor '", tensor.name(), "' lost its external offset"));
  }
  return offset;
}

// Pulls external data in (min_bytes < 0) or keeps dense tensors of at least min_bytes by reference.
absl::StatusOr<onnx::ModelProto> LoadWithExternalData(const fs::path& path, int64_t min_bytes) {
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(path);
  if (!model.ok()) return model.status();
  if (absl::Status visible = CheckTensorsVisible(*model); !visible.ok()) return visible;
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::map<fs::path, int64_t> sizes;
  absl::Status status = absl::OkStatus();
  ForEachTensor(&*model, [&](onnx::TensorProto* tensor, TensorKind kind) {
    if (!status.ok() || tensor->data_location() != onnx::TensorProto::EXTERNAL) return;
    absl::StatusOr<ExternalRange> range = ResolveExternalRange(folder, *tensor, &sizes);
    if (!range.ok()) {
      status = range.status();
      return;
    }
    if (min_bytes >= 0 && kind == TensorKind::kDense && range->length >= min_bytes) {
      SetExternalEntries(tensor, range->file.string(), range->offset, range->length);
      return;
    }
    status = ReadFileRange(range->file.string(), range->offset, range->length, tensor->mutable_raw_data());
    tensor->clear_external_data();
    tensor->set_data_location(onnx::TensorProto::DEFAULT);
  });
  if (!status.ok()) return status;
  return model;
}

}  // namespace

absl::StatusOr<onnx::ModelProto> LoadModel(const fs::path& path) { return LoadWithExternalData(path, -1); }

absl::StatusOr<onnx::ModelProto> LoadModelByReference(const fs::path& path, int64_t min_bytes) {
  return LoadWithExternalData(path, std::max<int64_t>(min_bytes, 0));
}

bool IsByReference(const onnx::TensorProto& tensor) {
  return tensor.data_location() == onnx::TensorProto::EXTERNAL && fs::path(ExternalField(tensor, "location")).is_absolute();
}

int64_t TensorDataBytes(const onnx::TensorProto& tensor) {
  if (IsByReference(tensor)) {
    int64_t length = 0;
    return absl::SimpleAtoi(ExternalField(tensor, "length"), &length) ? length : 0;
  }
  if (tensor.has_raw_data()) return static_cast<int64_t>(tensor.raw_data().size());
  return static_cast<int64_t>(tensor.ByteSizeLong());
}

absl::Status ReadTensorBytes(const onnx::TensorProto& tensor, int64_t offset, int64_t length, std::string* out) {
  const int64_t size = TensorDataBytes(tensor);
  if (offset < 0 || length < 0 || offset > size || length > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes ", offset, "+", length, " of tensor '", tensor.name(), "' (",
                                              size, " bytes)"));
  }
  if (!IsByReference(tensor)) {
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL || !tensor.has_raw_data()) {
      return absl::FailedPreconditionError(absl::StrCat("tensor '", tensor.name(), "' has no raw data here"));
    }
    out->assign(tensor.raw_data(), static_cast<size_t>(offset), static_cast<size_t>(length));
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> start = ByReferenceOffset(tensor);
  if (!start.ok()) return start.status();
  return ReadFileRange(ExternalField(tensor, "location"), *start + offset, length, out);
}

bool SameTensorBytes(const onnx::TensorProto& a, const onnx::TensorProto& b) {
  constexpr int64_t kCompareChunkBytes = int64_t{8} << 20;
  const int64_t size = TensorDataBytes(a);
  std::string left, right;
  for (int64_t offset = 0; offset < size; offset += kCompareChunkBytes) {
    const int64_t length = std::min(kCompareChunkBytes, size - offset);
    if (!ReadTensorBytes(a, offset, length, &left).ok() || !ReadTensorBytes(b, offset, length, &right).ok() ||
        left != right) {
      return false;
    }
  }
  return true;
}

const std::string* RawBytes(const onnx::TensorProto& tensor, std::string* scratch, absl::Status* error) {
  if (tensor.data_location() != onnx::TensorProto::EXTERNAL) return tensor.has_raw_data() ? &tensor.raw_data() : nullptr;
  absl::Status status = ReadTensorBytes(tensor, 0, TensorDataBytes(tensor), scratch);
  if (!status.ok()) {
    if (error != nullptr) *error = status;
    return nullptr;
  }
  return scratch;
}

absl::Status LoadTensorBytes(onnx::TensorProto* tensor) {
  if (!IsByReference(*tensor)) return absl::OkStatus();
  std::string bytes;
  absl::Status error = absl::OkStatus();
  if (RawBytes(*tensor, &bytes, &error) == nullptr) return error;
  tensor->clear_external_data();
  tensor->set_data_location(onnx::TensorProto::DEFAULT);
  tensor->set_raw_data(std::move(bytes));
  return absl::OkStatus();
}

absl::Status LoadAllTensorBytes(onnx::ModelProto* model) {
  absl::Status status = absl::OkStatus();
  ForEachTensor(model, [&](onnx::TensorProto* tensor, TensorKind) {
    if (status.ok()) status = LoadTensorBytes(tensor);
  });
  return status;
}

namespace {

// A write that failed for want of space is RESOURCE_EXHAUSTED (DISK_FULL), anything else INTERNAL.
absl::Status WriteError(int error, const std::string& what) {
  if (error == ENOSPC || error == EDQUOT) {
    return Failure(absl::StatusCode::kResourceExhausted, v1::ErrorReason::DISK_FULL,
                   absl::StrCat(what, ": ", std::strerror(error)));
  }
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(error)));
}

}  // namespace

namespace {

// A file written under a temporary name and renamed into place by Commit(), so that readers never
// see half of it; the temporary file is removed if Commit() is never reached.
class AtomicFileWriter {
 public:
  // `durable`: flushed to the disk before the rename, so that the file survives a crash of the machine
  // once Commit() returns. Without it the rename still never shows a half-written file to readers.
  explicit AtomicFileWriter(fs::path path, bool durable = true)
      : path_(std::move(path)), temporary_(path_.string() + ".tmp-" + std::to_string(::getpid())), durable_(durable) {}
  ~AtomicFileWriter() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(temporary_.c_str());
    }
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Open() {
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return WriteError(errno, absl::StrCat("cannot create ", temporary_.string()));
    return absl::OkStatus();
  }

  absl::Status Append(const char* data, size_t size) {
    size_t written = 0;
    while (written < size) {
      const ssize_t n = ::write(fd_, data + written, size - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return WriteError(errno, absl::StrCat("cannot write ", temporary_.string()));
      written += static_cast<size_t>(n);
    }
    size_ += static_cast<int64_t>(size);
    return absl::OkStatus();
  }

  // Serializes `message` straight into the file: no buffer of the whole model (95 MB for a 100k-node
  // decoder with inline weights) to fill and copy first. The caller has just called ByteSizeLong(),
  // which caches the sizes this writes by.
  absl::Status AppendMessage(const google::protobuf::MessageLite& message) {
    int64_t bytes = 0;
    bool serialized = false;
    int error = 0;
    {
      google::protobuf::io::FileOutputStream stream(fd_, /*block_size=*/1 << 20);
      {
        google::protobuf::io::CodedOutputStream coded(&stream);
        message.SerializeWithCachedSizes(&coded);
        serialized = !coded.HadError();
        bytes = coded.ByteCount();
      }
      serialized = stream.Flush() && serialized;
      error = stream.GetErrno();
    }
    if (!serialized) return WriteError(error != 0 ? error : EIO, absl::StrCat("cannot write ", temporary_.string()));
    size_ += bytes;
    return absl::OkStatus();
  }

  absl::Status PadTo(int64_t alignment) {
    const std::string zeros(static_cast<size_t>((alignment - size_ % alignment) % alignment), '\0');
    return Append(zeros.data(), zeros.size());
  }

  // Copies `length` bytes at `offset` of `source` in the kernel where it can (copy_file_range), so
  // the bytes never pass through this process's memory.
  absl::Status AppendFileRange(const std::string& source, int64_t offset, int64_t length) {
    const int in = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return absl::DataLossError(absl::StrCat("cannot open ", source, ": ", std::strerror(errno)));
    absl::Status status = absl::OkStatus();
    int64_t done = 0;
    bool kernel_copy = true;
    std::string buffer;
    while (status.ok() && done < length) {
      const size_t chunk = static_cast<size_t>(std::min<int64_t>(length - done, int64_t{64} << 20));
      if (kernel_copy) {
        loff_t from = offset + done;
        const ssize_t n = ::copy_file_range(in, &from, fd_, nullptr, chunk, 0);
        if (n > 0) {
          done += n;
          size_ += n;
        } else if (n < 0 && (errno == ENOSPC || errno == EDQUOT || errno == EIO)) {
          status = WriteError(errno, absl::StrCat("cannot write ", temporary_.string()));
        } else if (!(n < 0 && errno == EINTR)) {
          kernel_copy = false;  // EXDEV, ENOSYS, EINVAL, a 0 from odd files: copy through a buffer
        }
        continue;
      }
      buffer.resize(std::min<size_t>(chunk, size_t{8} << 20));
      status = PreadAll(in, offset + done, static_cast<int64_t>(buffer.size()), buffer.data(), source);
      if (status.ok()) status = Append(buffer.data(), buffer.size());
      done += static_cast<int64_t>(buffer.size());
    }
    ::close(in);
    return status;
  }

  absl::Status Commit() {
    int error = durable_ && ::fsync(fd_) != 0 ? errno : 0;
    if (::close(fd_) != 0 && error == 0) error = errno;  // closed whatever fsync said
    fd_ = -1;
    if (error != 0) {
      ::unlink(temporary_.c_str());
      return WriteError(error, absl::StrCat("cannot flush ", temporary_.string()));
    }
    if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
      const int rename_error = errno;
      ::unlink(temporary_.c_str());
      return absl::InternalError(absl::StrCat("cannot rename to ", path_.string(), ": ", std::strerror(rename_error)));
    }
    return durable_ ? SyncDirectory(path_.has_parent_path() ? path_.parent_path() : fs::path(".")) : absl::OkStatus();
  }

  int64_t size() const { return size_; }

 private:
  fs::path path_;
  fs::path temporary_;
  bool durable_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Writes `model` as the file at `path`. `bytes` is model.ByteSizeLong(), computed by the caller after
// its last edit of the model: serialization writes by the sizes that call cached.
absl::Status WriteModelFile(const onnx::ModelProto& model, size_t bytes, const fs::path& path, bool durable = true) {
  if (bytes > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::MODEL_TOO_LARGE,
                   "the model does not fit a protobuf message even with "
                   "external data");
  }
  AtomicFileWriter file(path, durable);
  absl::Status status = file.Open();
  if (status.ok()) status = file.AppendMessage(model);
  if (status.ok()) status = file.Commit();
  return status;
}

}  // namespace

absl::Status SyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", dir.string(), ": ", std::strerror(errno)));
  const int error = ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  if (error != 0) return WriteError(error, absl::StrCat("cannot flush the folder ", dir.string()));
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const fs::path& path, const std::string& bytes) {
  AtomicFileWriter file(path);
  absl::Status status = file.Open();
  if (status.ok()) status = file.Append(bytes.data(), bytes.size());
  if (status.ok()) status = file.Commit();
  return status;
}

namespace {

// A top-level field of a serialized ModelProto: where it lies in the file.
struct FieldSpan {
  int number;
  int64_t begin, end;  // [begin, end): its tag, length and payload
};

// Reads a varint at `*at` from `in`; false at the end of the file or on a malformed varint.
bool ReadVarint(std::istream& in, int64_t* at, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const int byte = in.get();
    if (byte == std::char_traits<char>::eof()) return false;
    ++*at;
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// The top-level fields of the model file, scanned by their tags and lengths (nothing parsed).
absl::StatusOr<std::vector<FieldSpan>> ScanModelFields(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  const int64_t size = static_cast<int64_t>(fs::file_size(path));
  std::vector<FieldSpan> fields;
  int64_t at = 0;
  while (at < size) {
    const int64_t begin = at;
    uint64_t tag = 0, length = 0;
    if (!ReadVarint(in, &at, &tag)) break;
    switch (tag & 7) {
      case 0:
        if (!ReadVarint(in, &at, &length)) at = size + 1;
        length = 0;
        break;
      case 1: length = 8; break;
      case 2:
        if (!ReadVarint(in, &at, &length)) at = size + 1;
        break;
      case 5: length = 4; break;
      default: at = size + 1;  // groups: not in an ONNX model
    }
    if (at > size || length > static_cast<uint64_t>(size - at)) {
      return absl::DataLossError(absl::StrCat(path.string(), " is not a well-formed model file"));
    }
    at += static_cast<int64_t>(length);
    in.seekg(at);
    fields.push_back({static_cast<int>(tag >> 3), begin, at});
  }
  if (at != size) return absl::DataLossError(absl::StrCat(path.string(), " is not a well-formed model file"));
  return fields;
}

// The fields that hold the model's bulk: copied byte for byte, never parsed.
bool IsBulkField(int number) {
  return number == onnx::ModelProto::kGraphFieldNumber || number == onnx::ModelProto::kFunctionsFieldNumber ||
         number == onnx::ModelProto::kTrainingInfoFieldNumber;
}

}  // namespace

absl::Status RewriteModelHeader(const fs::path& path, const std::function<void(onnx::ModelProto*)>& edit) {
  absl::StatusOr<std::vector<FieldSpan>> fields = ScanModelFields(path);
  if (!fields.ok()) return fields.status();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path.string(), ": ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // The small fields parse as a model of their own (a message is the concatenation of its fields).
  std::string small;
  for (const FieldSpan& field : *fields) {
    if (IsBulkField(field.number)) continue;
    const size_t offset = small.size();
    small.resize(offset + static_cast<size_t>(field.end - field.begin));
    if (absl::Status read = PreadAll(fd, field.begin, field.end - field.begin, small.data() + offset, path.string());
        !read.ok()) {
      return read;
    }
  }
  onnx::ModelProto header;
  if (!header.ParseFromString(small)) return absl::DataLossError(absl::StrCat(path.string(), " does not parse"));
  edit(&header);
  std::string header_bytes;
  if (!header.SerializeToString(&header_bytes)) return absl::InternalError("the model's header does not serialize");
  AtomicFileWriter file(path);
  if (absl::Status opened = file.Open(); !opened.ok()) return opened;
  if (absl::Status written = file.Append(header_bytes.data(), header_bytes.size()); !written.ok()) return written;
  std::vector<char> buffer(size_t{8} << 20);
  for (const FieldSpan& field : *fields) {
    if (!IsBulkField(field.number)) continue;
    for (int64_t at = field.begin; at < field.end;) {
      const int64_t chunk = std::min<int64_t>(field.end - at, static_cast<int64_t>(buffer.size()));
      if (absl::Status read = PreadAll(fd, at, chunk, buffer.data(), path.string()); !read.ok()) return read;
      if (absl::Status written = file.Append(buffer.data(), static_cast<size_t>(chunk)); !written.ok()) return written;
      at += chunk;
    }
  }
  return file.Commit();
}

absl::Status RelocateExternalData(const fs::path& path, const std::string& from, const std::string& to) {
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(path);
  if (!model.ok()) return model.status();
  ForEachTensor(&*model, [&](onnx::TensorProto* tensor, TensorKind) {
    for (auto& entry : *tensor->mutable_external_data()) {
      if (entry.key() == "location" && entry.value() == from) entry.set_value(to);
    }
  });
  return WriteModelFile(*model, model->ByteSizeLong(), path);
}

namespace {

absl::StatusOr<std::vector<fs::path>> SaveWithDataFile(onnx::ModelProto model, const fs::path& path,
                                                       const SaveOptions& options) {
  std::vector<fs::path> written;
  std::map<std::string, std::string> linked;  // a by-reference tensor's file -> its link beside the model
  // With options.link_by_reference: a link to the tensor's file beside the model, made once per file.
  auto link_name = [&](const std::string& source) -> absl::StatusOr<std::string> {
    auto [entry, added] = linked.emplace(source, "");
    if (!added) return entry->second;
    entry->second = absl::StrCat(path.filename().string(), ".ref", linked.size());
    const fs::path link = path.parent_path() / entry->second;
    std::error_code error;
    fs::create_hard_link(source, link, error);
    if (error) fs::copy_file(source, link, fs::copy_options::overwrite_existing, error);
    if (error) return absl::InternalError(absl::StrCat("cannot link or copy ", source, " to ", link.string(), ": ", error.message()));
    written.push_back(link);
    return entry->second;
  };
  {
    const std::string data_name = path.filename().string() + ".data";
    const fs::path data_path = path.parent_path() / data_name;
    AtomicFileWriter data(data_path, options.durable);
    absl::Status status = data.Open();
    ForEachTensor(&model, [&](onnx::TensorProto* tensor, TensorKind kind) {
      if (!status.ok()) return;
      // Sparse parts stay inline: runtimes densify them at load and need not read them from files.
      if (kind != TensorKind::kDense) {
        status = LoadTensorBytes(tensor);
        return;
      }
      const bool referenced = IsByReference(*tensor);
      if (!referenced && static_cast<int64_t>(tensor->raw_data().size()) < options.external_min_bytes) return;
      if (referenced && options.link_by_reference) {
        absl::StatusOr<int64_t> from = ByReferenceOffset(*tensor);
        absl::StatusOr<std::string> link = from.ok() ? link_name(ExternalField(*tensor, "location")) : from.status();
        if (!link.ok()) {
          status = link.status();
          return;
        }
        SetExternalEntries(tensor, *link, *from, TensorDataBytes(*tensor));
        return;
      }
      status = data.PadTo(4096);  // page-aligned, so runtimes can mmap
      if (!status.ok()) return;
      const int64_t offset = data.size();
      int64_t length = 0;
      if (referenced) {
        length = TensorDataBytes(*tensor);
        absl::StatusOr<int64_t> from = ByReferenceOffset(*tensor);
        if (!from.ok()) {
          status = from.status();
          return;
        }
        status = data.AppendFileRange(ExternalField(*tensor, "location"), *from, length);
      } else {
        length = static_cast<int64_t>(tensor->raw_data().size());
        status = data.Append(tensor->raw_data().data(), tensor->raw_data().size());
      }
      if (status.ok()) SetExternalEntries(tensor, data_name, offset, length);
    });
    if (status.ok()) status = data.Commit();
    if (!status.ok()) return status;
    written.insert(written.begin(), data_path);
  }
  absl::Status status = WriteModelFile(model, model.ByteSizeLong(), path, options.durable);
  if (!status.ok()) return status;
  written.insert(written.begin(), path);
  return written;
}

}  // namespace

absl::StatusOr<std::vector<fs::path>> SaveModel(const onnx::ModelProto& model, const fs::path& path,
                                                const SaveOptions& options) {
  const size_t bytes = model.ByteSizeLong();
  if (!HasTensorsByReference(model) && static_cast<int64_t>(bytes) <= options.external_threshold_bytes) {
    absl::Status status = WriteModelFile(model, bytes, path, options.durable);  // as it is: no copy of a model that may be big
    if (!status.ok()) return status;
    return std::vector<fs::path>{path};
  }
  onnx::ModelProto copy = model;  // its tensors' entries get rewritten to point into the data file
  return SaveWithDataFile(std::move(copy), path, options);
}

}  // namespace onnxopt
