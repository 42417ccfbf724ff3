#include "optimizer/input_generator.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace onnxopt {
namespace {

// Number of rows of the embedding table that `input` indexes through a Gather (possibly after a
// Cast), or 0 if it indexes none.
using InitializerIndex = std::map<std::string, const onnx::TensorProto*>;

int64_t IndexedTableRows(const onnx::GraphProto& graph, const InitializerIndex& initializers, const std::string& input) {
  std::vector<std::string> aliases = {input};
  for (const auto& node : graph.node()) {
    if (node.op_type() == "Cast" && node.input_size() == 1 && node.input(0) == input) aliases.push_back(node.output(0));
  }
  for (const auto& node : graph.node()) {
    if (node.op_type() != "Gather" || node.input_size() != 2) continue;
    if (std::find(aliases.begin(), aliases.end(), node.input(1)) == aliases.end()) continue;
    auto table = initializers.find(node.input(0));
    if (table == initializers.end()) continue;
    int64_t axis = 0;
    for (const auto& attribute : node.attribute()) {
      if (attribute.name() == "axis") axis = attribute.i();
    }
    const int rank = table->second->dims_size();
    if (axis < 0) axis += rank;
    if (axis >= 0 && axis < rank) return table->second->dims(static_cast<int>(axis));
  }
  return 0;
}

template <typename T, typename Fill>
Ort::Value MakeTensor(const std::vector<int64_t>& shape, Fill fill) {
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value value = Ort::Value::CreateTensor<T>(allocator, shape.data(), shape.size());
  T* data = value.GetTensorMutableData<T>();
  const size_t count = value.GetTensorTypeAndShapeInfo().GetElementCount();
  for (size_t i = 0; i < count; ++i) data[i] = fill();
  return value;
}

}  // namespace

int64_t DynamicDimValue(const std::string& dim_name, int position, const v1::ValidationConfig& config) {
  auto it = config.dim_values().find(dim_name);
  if (it != config.dim_values().end()) return it->second;
  if (position == 0 || absl::StrContains(absl::AsciiStrToLower(dim_name), "batch")) return 1;
  return 16;
}

absl::StatusOr<GeneratedInputs> GenerateInputs(Ort::Session& session, const onnx::ModelProto& model,
                                               const v1::ValidationConfig& config, int sample) {
  GeneratedInputs inputs;
  std::mt19937_64 random(config.seed() * 1000003 + static_cast<uint64_t>(sample));
  InitializerIndex initializers;
  for (const auto& tensor : model.graph().initializer()) initializers[tensor.name()] = &tensor;
  try {
    Ort::AllocatorWithDefaultOptions allocator;
    for (size_t i = 0; i < session.GetInputCount(); ++i) {
      const std::string name = session.GetInputNameAllocated(i, allocator).get();
      Ort::TypeInfo type_info = session.GetInputTypeInfo(i);
      if (type_info.GetONNXType() != ONNX_TYPE_TENSOR) {
        return absl::InvalidArgumentError(absl::StrCat("INPUT_UNSUPPORTED: input '", name,
                                                       "' is not a tensor; supply inputs with the job"));
      }
      auto tensor_info = type_info.GetTensorTypeAndShapeInfo();
      std::vector<int64_t> shape = tensor_info.GetShape();
      std::vector<const char*> symbolic(shape.size(), nullptr);
      tensor_info.GetSymbolicDimensions(symbolic.data(), symbolic.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] < 0) shape[d] = DynamicDimValue(symbolic[d] ? symbolic[d] : "", static_cast<int>(d), config);
      }
      const std::string lower = absl::AsciiStrToLower(name);
      const bool is_mask = absl::StrContains(lower, "mask");
      const int64_t rows = IndexedTableRows(model.graph(), initializers, name);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      auto integer = [&]() -> int64_t {
        if (rows > 0) return std::uniform_int_distribution<int64_t>(0, rows - 1)(random);
        return is_mask ? 1 : 0;
      };
      Ort::Value value(nullptr);
      switch (tensor_info.GetElementType()) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
          value = MakeTensor<float>(shape, [&] { return normal(random); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
          value = MakeTensor<double>(shape, [&] { return static_cast<double>(normal(random)); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
          value = MakeTensor<Ort::Float16_t>(shape, [&] { return Ort::Float16_t(normal(random)); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
          value = MakeTensor<int64_t>(shape, integer);
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
          value = MakeTensor<int32_t>(shape, [&] { return static_cast<int32_t>(integer()); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
          value = MakeTensor<uint8_t>(shape, [&] { return static_cast<uint8_t>(integer()); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
          value = MakeTensor<int8_t>(shape, [&] { return static_cast<int8_t>(integer()); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
          value = MakeTensor<bool>(shape, [] { return true; });
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat("INPUT_UNSUPPORTED: input '", name, "' has element type ",
                                                         tensor_info.GetElementType(),
                                                         " which onnxopt cannot generate; supply inputs with the job"));
      }
      inputs.shapes[name] = absl::StrJoin(shape, "x");
      inputs.names.push_back(name);
      inputs.values.push_back(std::move(value));
    }
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("generating inputs: ", e.what()));
  }
  return inputs;
}

}  // namespace onnxopt
