#include "optimizer/tensor_convert.h"

#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "optimizer/model_io.h"

namespace onnxopt {
// Bytes per element for fixed-size types onnxopt converts; 0 for others.
size_t ElementSize(int32_t type) {
  switch (type) {
    case onnx::TensorProto::FLOAT: case onnx::TensorProto::INT32: case onnx::TensorProto::UINT32: return 4;
    case onnx::TensorProto::DOUBLE: case onnx::TensorProto::INT64: case onnx::TensorProto::UINT64: return 8;
    case onnx::TensorProto::INT16: case onnx::TensorProto::UINT16: case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16: return 2;
    case onnx::TensorProto::INT8: case onnx::TensorProto::UINT8: case onnx::TensorProto::BOOL: return 1;
    default: return 0;
  }
}

namespace {

// Serializes the typed repeated field of `tensor` into little-endian element bytes.
std::string TypedFieldBytes(const onnx::TensorProto& tensor, size_t count) {
  std::string bytes(count * ElementSize(tensor.data_type()), '\0');
  char* out = bytes.data();
  auto put = [&](size_t i, auto value) { std::memcpy(out + i * sizeof(value), &value, sizeof(value)); };
  switch (tensor.data_type()) {
    case onnx::TensorProto::FLOAT:
      for (size_t i = 0; i < count; ++i) put(i, tensor.float_data(static_cast<int>(i)));
      break;
    case onnx::TensorProto::DOUBLE:
      for (size_t i = 0; i < count; ++i) put(i, tensor.double_data(static_cast<int>(i)));
      break;
    case onnx::TensorProto::INT64:
      for (size_t i = 0; i < count; ++i) put(i, tensor.int64_data(static_cast<int>(i)));
      break;
    case onnx::TensorProto::UINT64:
    case onnx::TensorProto::UINT32:
      for (size_t i = 0; i < count; ++i) {
        const uint64_t v = tensor.uint64_data(static_cast<int>(i));
        if (tensor.data_type() == onnx::TensorProto::UINT32) put(i, static_cast<uint32_t>(v)); else put(i, v);
      }
      break;
    case onnx::TensorProto::INT32: for (size_t i = 0; i < count; ++i) put(i, tensor.int32_data(static_cast<int>(i))); break;
    case onnx::TensorProto::INT16: for (size_t i = 0; i < count; ++i) put(i, static_cast<int16_t>(tensor.int32_data(static_cast<int>(i)))); break;
    case onnx::TensorProto::UINT16: case onnx::TensorProto::FLOAT16: case onnx::TensorProto::BFLOAT16:
      for (size_t i = 0; i < count; ++i) put(i, static_cast<uint16_t>(tensor.int32_data(static_cast<int>(i))));
      break;
    case onnx::TensorProto::INT8: for (size_t i = 0; i < count; ++i) put(i, static_cast<int8_t>(tensor.int32_data(static_cast<int>(i)))); break;
    case onnx::TensorProto::UINT8: case onnx::TensorProto::BOOL:
      for (size_t i = 0; i < count; ++i) put(i, static_cast<uint8_t>(tensor.int32_data(static_cast<int>(i))));
      break;
    default: break;
  }
  return bytes;
}

int TypedFieldSize(const onnx::TensorProto& tensor) {
  switch (tensor.data_type()) {
    case onnx::TensorProto::FLOAT: return tensor.float_data_size();
    case onnx::TensorProto::DOUBLE: return tensor.double_data_size();
    case onnx::TensorProto::INT64: return tensor.int64_data_size();
    case onnx::TensorProto::UINT64: case onnx::TensorProto::UINT32: return tensor.uint64_data_size();
    default: return tensor.int32_data_size();
  }
}

}  // namespace

std::optional<uint64_t> CheckedByteSize(const std::vector<int64_t>& dims, size_t element_size) {
  uint64_t size = element_size;
  for (int64_t dim : dims) {
    if (dim < 0) return std::nullopt;
    if (dim != 0 && size > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) return std::nullopt;
    size *= static_cast<uint64_t>(dim);
  }
  return size;
}

absl::StatusOr<absl::string_view> TensorBytes(const onnx::TensorProto& tensor, std::string* scratch) {
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL && !IsByReference(tensor)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name(), "' has external data; load it first"));
  }
  const size_t element_size = ElementSize(tensor.data_type());
  if (element_size == 0) {
    return absl::UnimplementedError(
        absl::StrCat("tensor '", tensor.name(), "': element type ", tensor.data_type(), " is not converted"));
  }
  for (int64_t dim : tensor.dims()) {
    if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name(), "' has a negative dimension"));
  }
  const std::optional<uint64_t> size =
      CheckedByteSize(std::vector<int64_t>(tensor.dims().begin(), tensor.dims().end()), element_size);
  if (!size) return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name(), "' is too large"));
  const size_t count = *size / element_size;
  absl::string_view bytes = tensor.raw_data();
  if (IsByReference(tensor)) {
    absl::Status read = absl::OkStatus();
    const std::string* referenced = RawBytes(tensor, scratch, &read);
    if (referenced == nullptr) return read;
    bytes = *referenced;
  } else if (!tensor.has_raw_data()) {
    if (static_cast<size_t>(TypedFieldSize(tensor)) != count) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name(), "' holds ", TypedFieldSize(tensor),
                                                     " values for ", count, " elements"));
    }
    *scratch = TypedFieldBytes(tensor, count);
    bytes = *scratch;
  }
  if (bytes.size() != *size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name(), "' has ", bytes.size(), " bytes of data for ", count, " elements"));
  }
  return bytes;
}

absl::StatusOr<Ort::Value> TensorProtoToOrtValue(const onnx::TensorProto& tensor) {
  std::vector<int64_t> shape(tensor.dims().begin(), tensor.dims().end());
  const auto type = static_cast<ONNXTensorElementDataType>(tensor.data_type());
  try {
    Ort::AllocatorWithDefaultOptions allocator;
    if (tensor.data_type() == onnx::TensorProto::STRING) {
      const std::optional<uint64_t> count = CheckedByteSize(shape, 1);
      if (!count || static_cast<uint64_t>(tensor.string_data_size()) != *count) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name(), "' has the wrong number of strings"));
      }
      Ort::Value value = Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), type);
      std::vector<const char*> strings;
      for (const auto& s : tensor.string_data()) strings.push_back(s.c_str());
      if (!strings.empty()) value.FillStringTensor(strings.data(), strings.size());
      return value;
    }
    std::string scratch;
    absl::StatusOr<absl::string_view> bytes = TensorBytes(tensor, &scratch);
    if (!bytes.ok()) return bytes.status();
    Ort::Value value = Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), type);
    if (!bytes->empty()) std::memcpy(value.GetTensorMutableRawData(), bytes->data(), bytes->size());
    return value;
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("tensor '", tensor.name(), "': ", e.what()));
  }
}

absl::StatusOr<onnx::TensorProto> OrtValueToTensorProto(const Ort::Value& value, const std::string& name) {
  try {
    if (!value.IsTensor()) return absl::UnimplementedError("not a tensor");
    auto info = value.GetTensorTypeAndShapeInfo();
    onnx::TensorProto tensor;
    tensor.set_name(name);
    tensor.set_data_type(static_cast<int32_t>(info.GetElementType()));
    for (int64_t dim : info.GetShape()) tensor.add_dims(dim);
    const size_t count = info.GetElementCount();
    if (info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
      for (size_t i = 0; i < count; ++i) tensor.add_string_data(value.GetStringTensorElement(i));
      return tensor;
    }
    const size_t element_size = ElementSize(tensor.data_type());
    if (element_size == 0) return absl::UnimplementedError("element type is not converted");
    tensor.set_raw_data(std::string(static_cast<const char*>(value.GetTensorRawData()), count * element_size));
    return tensor;
  } catch (const Ort::Exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace onnxopt
