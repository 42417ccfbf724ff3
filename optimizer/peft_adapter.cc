#include "optimizer/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "optimizer/failure.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;        // what safetensors' own reader accepts
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53: JSON numbers arrive as doubles

absl::Status Invalid(absl::string_view what) {
  return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::SAFETENSORS_INVALID, what);
}

size_t DtypeSize(const std::string& dtype) {
  static const auto* sizes = new std::map<std::string, size_t>{
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4},  {"U32", 4},     {"F16", 2},    {"BF16", 2},
      {"I16", 2}, {"U16", 2}, {"U8", 1},  {"I8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes->find(dtype);
  return it == sizes->end() ? 0 : it->second;
}

std::optional<uint64_t> WholeNumber(const Value& value) {
  if (value.kind_case() != Value::kNumberValue) return std::nullopt;
  const double number = value.number_value();
  if (number < 0 || number > kMaxExactInteger || std::floor(number) != number) return std::nullopt;
  return static_cast<uint64_t>(number);
}

absl::StatusOr<Struct> ParseJsonObject(absl::string_view text, absl::string_view what) {
  Struct parsed;
  google::protobuf::util::JsonParseOptions options;
  auto status = google::protobuf::util::JsonStringToMessage(std::string(text), &parsed, options);
  if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat(what, " is not a JSON object: ", status.ToString()));
  return parsed;
}

// The checkpoint's values as floats, from F32, F16 or BF16.
absl::StatusOr<std::vector<float>> Floats(const std::string& key, const SafeTensor& tensor) {
  const size_t count = tensor.data.size() / std::max<size_t>(DtypeSize(tensor.dtype), 1);
  std::vector<float> values(count);
  if (tensor.dtype == "F32") {
    std::memcpy(values.data(), tensor.data.data(), count * sizeof(float));
  } else if (tensor.dtype == "F16" || tensor.dtype == "BF16") {
    for (size_t i = 0; i < count; ++i) {
      uint16_t bits;
      std::memcpy(&bits, tensor.data.data() + 2 * i, 2);
      if (tensor.dtype == "F16") {
        values[i] = HalfToFloat(bits);
      } else {
        const uint32_t widened = static_cast<uint32_t>(bits) << 16;
        std::memcpy(&values[i], &widened, sizeof(float));
      }
    }
  } else {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_UNSUPPORTED,
                   absl::StrCat("'", key, "' is ", tensor.dtype, "; LoRA matrices must be F32, F16 or BF16"));
  }
  return values;
}

// [rows, cols] -> [cols, rows], scaled, as a tensor of `type` (FLOAT or FLOAT16).
onnx::TensorProto Transposed(const std::string& name, const std::vector<float>& values, int64_t rows, int64_t cols,
                             float scale, int32_t type) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(type);
  tensor.add_dims(cols);
  tensor.add_dims(rows);
  std::string raw;
  raw.reserve(values.size() * (type == onnx::TensorProto::FLOAT ? 4 : 2));
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const float value = values[r * cols + c] * scale;
      if (type == onnx::TensorProto::FLOAT) {
        raw.append(reinterpret_cast<const char*>(&value), sizeof(value));
      } else {
        const uint16_t half = FloatToHalf(value);
        raw.append(reinterpret_cast<const char*>(&half), sizeof(half));
      }
    }
  }
  tensor.set_raw_data(std::move(raw));
  return tensor;
}

// peft's get_pattern_key: a pattern `key` with re.match(r"(.*\.)?(key)$", module). peft takes the first
// in the file's order, which a parsed JSON object no longer has: here the longest matching key wins (the
// most specific), then the smaller; INVALID_ARGUMENT for a value that is no number.
absl::StatusOr<std::optional<double>> PatternValue(const Struct& patterns, const std::string& module,
                                                   absl::string_view what) {
  std::vector<std::string> keys;
  for (const auto& [pattern, value] : patterns.fields()) keys.push_back(pattern);
  std::sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
  for (const std::string& pattern : keys) {
    bool matched = false;
    try {
      matched = std::regex_match(module, std::regex(absl::StrCat("(.*\\.)?(", pattern, ")")));
    } catch (const std::regex_error&) {
      continue;  // a pattern std::regex cannot read matches nothing here
    }
    if (!matched) continue;
    const Value& value = patterns.fields().at(pattern);
    if (value.kind_case() != Value::kNumberValue) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_INVALID,
                     absl::StrCat(what, "['", pattern, "'] is not a number"));
    }
    return std::optional<double>(value.number_value());
  }
  return std::optional<double>();
}

struct PeftConfig {
  double r = 0;
  double alpha = 0;
  bool rslora = false;
  Struct rank_pattern, alpha_pattern;
};

absl::StatusOr<PeftConfig> ReadPeftConfig(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<Struct> json = ParseJsonObject(*text, path.filename().string());
  if (!json.ok()) return json.status();
  const auto& fields = json->fields();
  auto field = [&](const char* name) -> const Value* {
    auto it = fields.find(name);
    return it == fields.end() || it->second.kind_case() == Value::kNullValue ? nullptr : &it->second;
  };
  if (const Value* type = field("peft_type"); type != nullptr && type->string_value() != "LORA") {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_UNSUPPORTED,
                   absl::StrCat("peft_type '", type->string_value(), "'; only LORA adapters convert"));
  }
  if (const Value* dora = field("use_dora"); dora != nullptr && dora->bool_value()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_UNSUPPORTED,
                   "use_dora: DoRA's magnitude vectors have no inputs in the model");
  }
  PeftConfig config;
  const Value* r = field("r");
  const Value* alpha = field("lora_alpha");
  if (r == nullptr || r->number_value() <= 0 || alpha == nullptr || alpha->kind_case() != Value::kNumberValue) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_INVALID,
                   absl::StrCat(path.filename().string(), " needs a positive `r` and a numeric `lora_alpha`"));
  }
  config.r = r->number_value();
  config.alpha = alpha->number_value();
  if (const Value* rslora = field("use_rslora")) config.rslora = rslora->bool_value();
  if (const Value* pattern = field("rank_pattern")) config.rank_pattern = pattern->struct_value();
  if (const Value* pattern = field("alpha_pattern")) config.alpha_pattern = pattern->struct_value();
  return config;
}

}  // namespace

absl::StatusOr<std::map<std::string, SafeTensor>> ParseSafetensors(absl::string_view bytes) {
  if (bytes.size() < 8) {
    return Invalid(absl::StrCat("the file has ", bytes.size(), " bytes, fewer than its header size"));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);  // little-endian hosts
  if (header_size > kMaxHeaderBytes) {
    return Invalid(absl::StrCat("a header of ", header_size, " bytes (at most 100 MB)"));
  }
  if (header_size > bytes.size() - 8) {
    return Invalid(
        absl::StrCat("the header says ", header_size, " bytes; the file has ", bytes.size() - 8, " after it"));
  }
  const absl::string_view header = absl::StripTrailingAsciiWhitespace(bytes.substr(8, header_size));
  if (header.empty() || header.front() != '{') return Invalid("the header is not a JSON object");
  absl::StatusOr<Struct> json = ParseJsonObject(header, "the header");
  if (!json.ok()) return Invalid(json.status().message());
  const absl::string_view data = bytes.substr(8 + header_size);
  std::map<std::string, SafeTensor> tensors;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, entry] : json->fields()) {
    if (name == "__metadata__") continue;
    const auto& fields = entry.struct_value().fields();
    auto dtype = fields.find("dtype");
    auto shape = fields.find("shape");
    auto offsets = fields.find("data_offsets");
    if (dtype == fields.end() || shape == fields.end() || offsets == fields.end() ||
        offsets->second.list_value().values_size() != 2) {
      return Invalid(absl::StrCat("'", name, "' lacks dtype, shape or a [begin, end] data_offsets"));
    }
    SafeTensor tensor;
    tensor.dtype = dtype->second.string_value();
    const size_t element = DtypeSize(tensor.dtype);
    if (element == 0) return Invalid(absl::StrCat("'", name, "' has the unknown dtype '", tensor.dtype, "'"));
    for (const Value& dim : shape->second.list_value().values()) {
      const std::optional<uint64_t> value = WholeNumber(dim);
      if (!value) return Invalid(absl::StrCat("'", name, "' has a shape that is not a list of sizes"));
      tensor.shape.push_back(static_cast<int64_t>(*value));
    }
    const std::optional<uint64_t> size = CheckedByteSize(tensor.shape, element);
    if (!size) return Invalid(absl::StrCat("'", name, "' has a shape that is not a list of sizes"));
    const uint64_t expected = *size;
    const std::optional<uint64_t> begin = WholeNumber(offsets->second.list_value().values(0));
    const std::optional<uint64_t> end = WholeNumber(offsets->second.list_value().values(1));
    if (!begin || !end || *begin > *end || *end > data.size()) {
      return Invalid(absl::StrCat("'", name, "' has data_offsets outside the ", data.size(), " bytes of data"));
    }
    if (*end - *begin != expected) {
      return Invalid(absl::StrCat("'", name, "' spans ", *end - *begin, " bytes; its shape and dtype need ", expected));
    }
    tensor.data = std::string(data.substr(*begin, *end - *begin));
    spans.emplace_back(*begin, *end);
    tensors[name] = std::move(tensor);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : spans) {
    if (begin != covered) {
      return Invalid(
          absl::StrCat("tensors ", begin < covered ? "overlap" : "leave a hole", " at byte ", begin, " of the data"));
    }
    covered = end;
  }
  if (covered != data.size()) {
    return Invalid(absl::StrCat("the tensors cover ", covered, " of the ", data.size(), " bytes of data"));
  }
  return tensors;
}

absl::StatusOr<std::vector<onnx::TensorProto>> ConvertPeftCheckpoint(const std::filesystem::path& folder,
                                                                     const onnx::ModelProto& model,
                                                                     std::vector<std::string>* notes) {
  absl::StatusOr<PeftConfig> config = ReadPeftConfig(folder / "adapter_config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::string> bytes = ReadFile(folder / "adapter_model.safetensors");
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::map<std::string, SafeTensor>> tensors = ParseSafetensors(*bytes);
  if (!tensors.ok()) return tensors.status();
  std::map<std::string, const onnx::ValueInfoProto*> inputs;
  for (const onnx::ValueInfoProto* input : AdapterInputs(model)) inputs[input->name()] = input;
  if (inputs.empty()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                   "the model takes no adapter inputs; optimize it with the extract_adapters pass first");
  }
  std::vector<onnx::TensorProto> parameters;
  std::set<std::string> converted;
  for (const auto& [key, a] : *tensors) {
    // peft's keys end as the model's inputs do: <module path>.lora_A.weight, <module path>.lora_B.weight.
    char which = 0;
    std::string prefix;
    if (!ParseAdapterParameterName(key, &which, &prefix)) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_UNSUPPORTED,
                     absl::StrCat("'", key,
                                  "' is not a LoRA matrix of a Linear layer (embedding adapters, DoRA, biases "
                                  "and modules_to_save have no inputs in the model)"));
    }
    auto partner = tensors->find(AdapterParameterName(prefix, which == 'A' ? 'B' : 'A'));
    if (partner == tensors->end()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_INVALID,
                     absl::StrCat("'", key, "' has no lora_", which == 'A' ? "B" : "A", " beside it"));
    }
    if (which == 'B') continue;  // converted with its A
    const auto b_entry = partner;
    const SafeTensor& b = b_entry->second;
    if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[0] != b.shape[1]) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_INVALID,
                     absl::StrCat("'", prefix, "': lora_A is [", absl::StrJoin(a.shape, ", "), "] and lora_B [",
                                  absl::StrJoin(b.shape, ", "), "]; peft writes [r, in] and [out, r]"));
    }
    const int64_t rank = a.shape[0];
    const std::string peft_module(absl::StripPrefix(prefix, "base_model.model."));
    absl::StatusOr<std::optional<double>> rank_override =
        PatternValue(config->rank_pattern, peft_module, "rank_pattern");
    if (!rank_override.ok()) return rank_override.status();
    const double expected_rank = rank_override->value_or(config->r);
    if (static_cast<double>(rank) != expected_rank) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_INVALID,
                     absl::StrCat("'", prefix, "' has rank ", rank, "; adapter_config.json says ", expected_rank));
    }
    absl::StatusOr<std::optional<double>> alpha_override =
        PatternValue(config->alpha_pattern, peft_module, "alpha_pattern");
    if (!alpha_override.ok()) return alpha_override.status();
    const double alpha = alpha_override->value_or(config->alpha);
    const float scale = static_cast<float>(alpha / (config->rslora ? std::sqrt(static_cast<double>(rank)) : rank));
    const std::string module = CanonicalModulePath(prefix);
    const std::string a_name = AdapterParameterName(module, 'A'), b_name = AdapterParameterName(module, 'B');
    auto a_input = inputs.find(a_name);
    if (a_input == inputs.end() || inputs.count(b_name) == 0) {
      return Failure(
          absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
          absl::StrCat("the checkpoint adapts '", module, "', which the model does not take an adapter for (it takes ",
                       inputs.size() / 2, " modules, e.g. '", inputs.begin()->first, "')"));
    }
    if (!converted.insert(a_name).second) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::PEFT_INVALID,
                     absl::StrCat("two of the checkpoint's modules are both '", module, "' without the wrappers"));
    }
    const int32_t type = a_input->second->type().tensor_type().elem_type();
    if (type != onnx::TensorProto::FLOAT && type != onnx::TensorProto::FLOAT16) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ADAPTER_MISMATCH,
                     absl::StrCat("the model's '", a_name, "' is of element type ", type,
                                  "; float32 and float16 adapters convert"));
    }
    absl::StatusOr<std::vector<float>> a_values = Floats(key, a);
    if (!a_values.ok()) return a_values.status();
    absl::StatusOr<std::vector<float>> b_values = Floats(b_entry->first, b);
    if (!b_values.ok()) return b_values.status();
    parameters.push_back(Transposed(a_name, *a_values, a.shape[0], a.shape[1], 1.0f, type));
    parameters.push_back(Transposed(b_name, *b_values, b.shape[0], b.shape[1], scale, type));
  }
  if (absl::Status fits = CheckAdapterFitsModel(parameters, model); !fits.ok()) return fits;
  std::vector<std::string> left;
  for (const auto& [name, input] : inputs) {
    char which = 0;
    std::string module;
    if (ParseAdapterParameterName(name, &which, &module) && which == 'A' && converted.count(name) == 0) {
      left.push_back(module);
    }
  }
  if (!left.empty() && notes != nullptr) {
    notes->push_back(absl::StrCat("the checkpoint adapts no ", absl::StrJoin(left, ", "),
                                  ": the model runs its base weights there"));
  }
  return parameters;
}

}  // namespace onnxopt
