#include "optimizer/passes/constants.h"

#include <cstring>

#include "optimizer/model_io.h"

namespace onnxopt {
namespace {

template <typename T>
std::vector<T> FromRaw(const std::string& raw) {
  std::vector<T> values(raw.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), raw.data(), values.size() * sizeof(T));
  return values;
}

}  // namespace

const onnx::TensorProto* ConstantTensor(const Graph& graph, const std::string& value) {
  if (!graph.IsGraphInput(value)) {
    if (const onnx::TensorProto* init = graph.Initializer(value)) return init;
  }
  const Node* producer = graph.Producer(value);
  if (producer == nullptr || producer->op_type() != "Constant" || !producer->domain().empty()) return nullptr;
  const onnx::AttributeProto* attribute = producer->FindAttribute("value");
  return attribute != nullptr && attribute->has_t() ? &attribute->t() : nullptr;
}

std::optional<std::vector<int64_t>> TensorInts(const onnx::TensorProto& tensor) {
  // Raw bytes inline or by reference; nullptr for typed fields. An external tensor not resolved here,
  // or one that cannot be read, is no known value.
  std::string scratch;
  absl::Status unreadable = absl::OkStatus();
  const std::string* raw = RawBytes(tensor, &scratch, &unreadable);
  if (!unreadable.ok()) return std::nullopt;
  if (tensor.data_type() == onnx::TensorProto::INT64) {
    if (raw != nullptr) return FromRaw<int64_t>(*raw);
    return std::vector<int64_t>(tensor.int64_data().begin(), tensor.int64_data().end());
  }
  if (tensor.data_type() == onnx::TensorProto::INT32) {
    std::vector<int32_t> narrow = raw != nullptr
                                      ? FromRaw<int32_t>(*raw)
                                      : std::vector<int32_t>(tensor.int32_data().begin(), tensor.int32_data().end());
    return std::vector<int64_t>(narrow.begin(), narrow.end());
  }
  return std::nullopt;
}

std::optional<std::vector<float>> TensorFloats(const onnx::TensorProto& tensor) {
  if (tensor.data_type() != onnx::TensorProto::FLOAT) return std::nullopt;
  std::string scratch;
  absl::Status unreadable = absl::OkStatus();
  const std::string* raw = RawBytes(tensor, &scratch, &unreadable);
  if (!unreadable.ok()) return std::nullopt;
  if (raw != nullptr) return FromRaw<float>(*raw);
  return std::vector<float>(tensor.float_data().begin(), tensor.float_data().end());
}

std::optional<std::vector<float>> ChannelFloats(const onnx::TensorProto& tensor, int64_t channels, int rank) {
  std::optional<std::vector<float>> values = TensorFloats(tensor);
  if (!values) return std::nullopt;
  if (values->size() == 1) return std::vector<float>(static_cast<size_t>(channels), (*values)[0]);
  if (static_cast<int64_t>(values->size()) != channels) return std::nullopt;
  const int dims = tensor.dims_size();
  const int channel_axis = dims == rank ? 1 : (dims == rank - 1 ? 0 : -1);
  if (channel_axis < 0) return std::nullopt;
  for (int d = 0; d < dims; ++d) {
    if (d != channel_axis && tensor.dims(d) != 1) return std::nullopt;
  }
  return values;
}

std::optional<std::vector<int64_t>> ConstantInts(const Graph& graph, const std::string& value) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  return tensor == nullptr ? std::nullopt : TensorInts(*tensor);
}

std::optional<std::vector<int64_t>> ConstantAxes(const Graph& graph, const Node& node) {
  if (node.input_size() > 1) return ConstantInts(graph, node.input(1));
  const onnx::AttributeProto* attribute = node.FindAttribute("axes");
  if (attribute == nullptr) return std::nullopt;
  return std::vector<int64_t>(attribute->ints().begin(), attribute->ints().end());
}

std::optional<std::vector<float>> ConstantFloats(const Graph& graph, const std::string& value) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  return tensor == nullptr ? std::nullopt : TensorFloats(*tensor);
}

onnx::TensorProto MakeInt64Tensor(const std::string& name, const std::vector<int64_t>& values) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(onnx::TensorProto::INT64);
  tensor.add_dims(static_cast<int64_t>(values.size()));
  tensor.set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
  return tensor;
}

onnx::TensorProto MakeIntScalar(const std::string& name, int32_t type, int64_t value) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(type);
  if (type == onnx::TensorProto::INT32) {
    const int32_t narrow = static_cast<int32_t>(value);
    tensor.set_raw_data(std::string(reinterpret_cast<const char*>(&narrow), sizeof(narrow)));
  } else {
    tensor.set_data_type(onnx::TensorProto::INT64);
    tensor.set_raw_data(std::string(reinterpret_cast<const char*>(&value), sizeof(value)));
  }
  return tensor;
}

onnx::TensorProto MakeRawTensor(const std::string& name, int32_t type, const std::vector<int64_t>& dims,
                                std::string raw) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(type);
  for (int64_t dim : dims) tensor.add_dims(dim);
  tensor.set_raw_data(std::move(raw));
  return tensor;
}

onnx::TensorProto MakeFloatTensor(const std::string& name, const std::vector<int64_t>& dims,
                                  const std::vector<float>& values) {
  return MakeRawTensor(name, onnx::TensorProto::FLOAT, dims,
                       std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
}

}  // namespace onnxopt
