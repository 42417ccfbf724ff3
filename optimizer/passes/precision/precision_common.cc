#include "optimizer/passes/precision/precision_common.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "optimizer/model_io.h"

namespace onnxopt {
namespace {

using onnx::TensorProto;

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

std::optional<int32_t> AttributeType(const Node& node, const char* name) {
  const onnx::AttributeProto* attribute = node.FindAttribute(name);
  if (attribute == nullptr) return std::nullopt;
  if (attribute->has_t()) return attribute->t().data_type();
  return static_cast<int32_t>(attribute->i());
}

// The type rule of output `index` of `node`, given the types known so far; nullopt if unknown.
std::optional<int32_t> OutputType(const Node& node, int index,
                                  const std::unordered_map<std::string, int32_t>& types) {
  auto type_of = [&](int input) -> std::optional<int32_t> {
    if (input >= node.input_size() || node.input(input).empty()) return std::nullopt;
    auto it = types.find(node.input(input));
    return it == types.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  const std::string op(node.op_type());
  if (node.domain().empty()) {
    static const std::set<std::string> kInt64 = {"Shape", "Size", "ArgMax", "ArgMin", "NonZero", "NonMaxSuppression"};
    static const std::set<std::string> kBool = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not",
                                                "And", "Or", "Xor", "IsNaN", "IsInf"};
    if (kInt64.count(op) > 0) return TensorProto::INT64;
    if (kBool.count(op) > 0) return TensorProto::BOOL;
    if (op == "Cast") return AttributeType(node, "to");
    if (op == "CastLike") return type_of(1);
    if (op == "Constant") return AttributeType(node, "value");
    if (op == "ConstantOfShape") {
      std::optional<int32_t> type = AttributeType(node, "value");
      return type ? type : std::optional<int32_t>(TensorProto::FLOAT);
    }
    if (op == "TopK" && index == 1) return TensorProto::INT64;
    if (op == "Unique" && index > 0) return TensorProto::INT64;
    if (op == "MaxPool" && index == 1) return TensorProto::INT64;
    if (op == "MatMulInteger" || op == "ConvInteger") return TensorProto::INT32;
    if (op == "DynamicQuantizeLinear") return index == 1 ? TensorProto::FLOAT : TensorProto::UINT8;
    if (op == "QuantizeLinear") {
      std::optional<int32_t> zero_point = type_of(2);
      return zero_point ? zero_point : std::optional<int32_t>(TensorProto::UINT8);
    }
    if (op == "DequantizeLinear") return type_of(1);
    if (op == "Where") return type_of(1);
    if (op == "OneHot") return type_of(2);
    if (op == "RandomNormal" || op == "RandomUniform" || op == "EyeLike" || op == "RandomNormalLike" ||
        op == "RandomUniformLike" || op == "Multinomial") {
      std::optional<int32_t> type = AttributeType(node, "dtype");
      if (type) return type;
      if (op == "Multinomial") return TensorProto::INT32;
      if (op == "RandomNormal" || op == "RandomUniform") return TensorProto::FLOAT;
      return type_of(0);
    }
    if (op == "If" || op == "Loop" || op == "Scan" || op == "SequenceConstruct" || op == "Optional") {
      return std::nullopt;  // from the body: only shape inference knows
    }
  } else if (node.domain() == "com.microsoft") {
    if (op == "EmbedLayerNormalization" && index == 1) return TensorProto::INT32;
    if (op == "DynamicQuantizeMatMul" || op == "MatMulIntegerToFloat" || op == "MatMulNBits" ||
        op == "QAttention") {
      return type_of(0) && IsFloatType(*type_of(0)) ? type_of(0) : std::optional<int32_t>(TensorProto::FLOAT);
    }
  } else {
    return std::nullopt;  // a custom domain: no rule
  }
  // Outputs follow the first float input (Gather, Concat, MatMul, the contrib normalizations); an
  // operator without one passes its first input's type on (Reshape of ints, Concat of shapes).
  for (int i = 0; i < node.input_size(); ++i) {
    std::optional<int32_t> type = type_of(i);
    if (type && IsFloatType(*type)) return type;
  }
  for (int i = 0; i < node.input_size(); ++i) {
    if (node.input(i).empty()) continue;
    return type_of(i);
  }
  return std::nullopt;
}

}  // namespace

std::string NodeKey(const onnx::NodeProto& node) {
  if (!node.name().empty()) return node.name();
  return node.output_size() > 0 ? node.output(0) : std::string();
}

std::set<std::string> SplitNameList(const std::string& text) {
  std::set<std::string> items;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    items.insert(std::string(absl::StripAsciiWhitespace(item)));
  }
  return items;
}

bool IsFloatType(int32_t type) {
  return type == TensorProto::FLOAT || type == TensorProto::FLOAT16 || type == TensorProto::BFLOAT16 ||
         type == TensorProto::DOUBLE;
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = Bits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (magnitude < 0x38800000u) {  // below float16's smallest normal: a subnormal (or 0)
    float scaled;
    const uint32_t positive = magnitude;
    std::memcpy(&scaled, &positive, sizeof(scaled));
    // Subnormal halves are multiples of 2^-24; nearbyint rounds to even in the default mode.
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled * 16777216.0f)));
  }
  // Normal: rebias the exponent (127 -> 15), round the 13 dropped mantissa bits to nearest even.
  uint32_t half = (magnitude - 0x38000000u) >> 13;
  const uint32_t dropped = magnitude & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = (static_cast<uint32_t>(half) & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  uint32_t bits = Bits(magnitude) | sign;
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

uint16_t FloatToBfloat16(float value) {
  uint32_t bits = Bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

namespace {

// `value` as float16 (clamped into its finite, normal range; each clamp counted) or bfloat16 bits.
uint16_t SixteenBits(float value, int32_t to, int64_t* clamped) {
  if (to != TensorProto::FLOAT16) return FloatToBfloat16(value);
  const float magnitude = std::fabs(value);
  if (std::isfinite(value) && magnitude > kFloat16Max) {
    value = std::copysign(kFloat16Max, value);
    ++*clamped;
  } else if (magnitude != 0.0f && magnitude < kFloat16MinPositive) {
    value = std::copysign(kFloat16MinPositive, value);
    ++*clamped;
  }
  return FloatToHalf(value);
}

// Converts `count` floats stored at `floats` (native byte order, any alignment) into `out`.
void ConvertFloats(const char* floats, size_t count, int32_t to, char* out, int64_t* clamped) {
  for (size_t i = 0; i < count; ++i) {
    float value;
    std::memcpy(&value, floats + i * sizeof(float), sizeof(float));
    const uint16_t bits = SixteenBits(value, to, clamped);
    std::memcpy(out + i * sizeof(uint16_t), &bits, sizeof(bits));
  }
}

// Weights by reference are read and converted this much at a time: a 1 GiB weight used to be read
// whole and copied into floats, 2 GiB of fresh pages on top of the 512 MiB result.
constexpr int64_t kConvertChunkBytes = int64_t{16} << 20;

}  // namespace

onnx::TensorProto ConvertFloatTensor(const onnx::TensorProto& tensor, int32_t to, int64_t* clamped) {
  onnx::TensorProto converted;
  converted.set_name(tensor.name());
  *converted.mutable_dims() = tensor.dims();
  converted.set_data_type(to);
  if (!tensor.doc_string().empty()) converted.set_doc_string(tensor.doc_string());
  std::string raw;
  if (tensor.data_type() != TensorProto::FLOAT) {
    // No float values: an empty tensor of the new type, as for an unreadable one below.
  } else if (tensor.data_location() == TensorProto::EXTERNAL) {
    const int64_t bytes = TensorDataBytes(tensor);
    raw.resize(static_cast<size_t>(bytes / 4) * sizeof(uint16_t));
    std::string chunk;
    int64_t chunk_clamped = 0;
    for (int64_t offset = 0; offset < bytes; offset += kConvertChunkBytes) {
      if (!ReadTensorBytes(tensor, offset, std::min(kConvertChunkBytes, bytes - offset), &chunk).ok()) {
        raw.clear();
        chunk_clamped = 0;
        break;
      }
      ConvertFloats(chunk.data(), chunk.size() / 4, to, &raw[static_cast<size_t>(offset / 4) * sizeof(uint16_t)],
                    &chunk_clamped);
    }
    *clamped += chunk_clamped;
  } else if (tensor.has_raw_data()) {
    raw.resize(tensor.raw_data().size() / 4 * sizeof(uint16_t));
    ConvertFloats(tensor.raw_data().data(), tensor.raw_data().size() / 4, to, raw.data(), clamped);
  } else {
    raw.resize(static_cast<size_t>(tensor.float_data_size()) * sizeof(uint16_t));
    for (int i = 0; i < tensor.float_data_size(); ++i) {
      const uint16_t bits = SixteenBits(tensor.float_data(i), to, clamped);
      std::memcpy(&raw[static_cast<size_t>(i) * sizeof(uint16_t)], &bits, sizeof(bits));
    }
  }
  converted.set_raw_data(std::move(raw));
  return converted;
}

std::unordered_map<std::string, int32_t> InferElementTypes(const Graph& graph, const ShapeInfo* shapes) {
  std::unordered_map<std::string, int32_t> types;
  const onnx::GraphProto& proto = graph.proto();
  auto declare = [&](const onnx::ValueInfoProto& value) {
    if (value.type().has_tensor_type() && value.type().tensor_type().elem_type() != 0) {
      types[value.name()] = value.type().tensor_type().elem_type();
    }
  };
  for (const auto& value : proto.input()) declare(value);
  for (const auto& tensor : proto.initializer()) types[tensor.name()] = tensor.data_type();
  for (const auto& value : proto.value_info()) declare(value);
  for (const auto& value : proto.output()) declare(value);
  for (const Node* node : graph.Nodes()) {
    for (int i = 0; i < node->output_size(); ++i) {
      const std::string& output = node->output(i);
      if (output.empty() || types.count(output) > 0) continue;
      std::optional<int32_t> type;
      if (shapes != nullptr) type = shapes->ElementType(output);
      if (!type || *type == 0) type = OutputType(*node, i, types);
      if (type && *type != 0) types[output] = *type;
    }
  }
  return types;
}

std::optional<std::vector<Node*>> RowLookups(const Graph& graph, const std::string& table,
                                             const std::set<std::string>& blocked) {
  if (graph.IsGraphOutput(table)) return std::nullopt;
  std::vector<Node*> readers = graph.Consumers(table);
  for (const Node* reader : readers) {
    const bool row_lookup = reader->op_type() == "Gather" && reader->domain().empty() && reader->input(0) == table &&
                            reader->input(1) != table && reader->GetAttributeInt("axis", 0) == 0;
    if (!row_lookup || blocked.count(NodeKey(*reader)) > 0) return std::nullopt;
  }
  return readers;
}

}  // namespace onnxopt
