#include "optimizer/cache_interface.h"

#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"

namespace onnxopt {
namespace {

const onnx::TensorShapeProto* ShapeOf(const onnx::ValueInfoProto& value) {
  if (!value.type().has_tensor_type() || !value.type().tensor_type().has_shape()) return nullptr;
  return &value.type().tensor_type().shape();
}

std::string DimName(const onnx::ValueInfoProto& value, int axis) {
  const onnx::TensorShapeProto* shape = ShapeOf(value);
  if (shape == nullptr || axis >= shape->dim_size()) return "";
  return shape->dim(axis).dim_param();
}

bool IsInteger(const onnx::ValueInfoProto& value) {
  const int32_t type = value.type().tensor_type().elem_type();
  return type == onnx::TensorProto::INT64 || type == onnx::TensorProto::INT32;
}

// The present output a past input is fed back from, by the exporters' naming.
std::string PresentName(const std::string& past) {
  if (absl::StrContains(past, "past_key_values")) return absl::StrReplaceAll(past, {{"past_key_values", "present"}});
  return absl::StrReplaceAll(past, {{"past", "present"}});
}

}  // namespace

std::optional<int64_t> CacheInterface::RoleValue(const std::string& name, int64_t past, int64_t new_tokens) const {
  if (name.empty()) return std::nullopt;
  if (name == past_dim) return past;
  if (name == new_dim) return new_tokens;
  if (name == total_dim) return past + new_tokens;
  return std::nullopt;
}

std::optional<CacheInterface> FindCacheInterface(const onnx::GraphProto& graph) {
  std::map<std::string, const onnx::ValueInfoProto*> outputs;
  for (const auto& output : graph.output()) outputs[output.name()] = &output;
  CacheInterface cache;
  for (const auto& input : graph.input()) {
    if (!absl::StrContains(absl::AsciiStrToLower(input.name()), "past")) continue;
    auto present = outputs.find(PresentName(input.name()));
    const onnx::TensorShapeProto* past_shape = ShapeOf(input);
    if (present == outputs.end() || past_shape == nullptr) continue;
    const onnx::TensorShapeProto* present_shape = ShapeOf(*present->second);
    if (present_shape == nullptr || present_shape->dim_size() != past_shape->dim_size()) continue;
    // The growing axis: named in the past input, named otherwise (or not at all) in the present.
    int axis = -1;
    for (int d = 1; d < past_shape->dim_size(); ++d) {
      const auto& p = past_shape->dim(d);
      const auto& t = present_shape->dim(d);
      if (!p.dim_param().empty() && p.dim_param() != t.dim_param()) axis = d;
    }
    if (axis < 0) continue;
    const std::string& past_dim = past_shape->dim(axis).dim_param();
    if (!cache.past_dim.empty() && cache.past_dim != past_dim) return std::nullopt;  // one past length
    cache.past_dim = past_dim;
    if (cache.total_dim.empty()) cache.total_dim = present_shape->dim(axis).dim_param();
    cache.entries.push_back({input.name(), present->first, axis});
  }
  if (cache.entries.empty()) return std::nullopt;
  for (const auto& input : graph.input()) {
    const onnx::TensorShapeProto* shape = ShapeOf(input);
    if (shape != nullptr && shape->dim_size() <= 1 && input.type().tensor_type().elem_type() == onnx::TensorProto::BOOL &&
        absl::StrContains(absl::AsciiStrToLower(input.name()), "use_cache") && cache.use_cache_input.empty()) {
      cache.use_cache_input = input.name();
      continue;
    }
    if (shape == nullptr || shape->dim_size() != 2 || !IsInteger(input)) continue;
    const std::string lower = absl::AsciiStrToLower(input.name());
    if (absl::StrContains(lower, "mask")) {
      if (cache.mask_input.empty()) cache.mask_input = input.name();
    } else if (absl::StrContains(lower, "position")) {
      if (cache.position_input.empty()) cache.position_input = input.name();
    } else if (cache.ids_input.empty() && !absl::StrContains(lower, "position") &&
               !absl::StrContains(lower, "type")) {
      cache.ids_input = input.name();
    }
  }
  if (cache.ids_input.empty()) return std::nullopt;
  for (const auto& input : graph.input()) {
    if (input.name() == cache.ids_input) {
      cache.batch_dim = DimName(input, 0);
      cache.new_dim = DimName(input, 1);
    }
    if (input.name() == cache.mask_input) {
      const std::string mask_dim = DimName(input, 1);
      if (!mask_dim.empty() && mask_dim != cache.past_dim && mask_dim != cache.new_dim) cache.total_dim = mask_dim;
    }
  }
  if (cache.new_dim.empty() || cache.new_dim == cache.past_dim || cache.total_dim == cache.new_dim) return std::nullopt;
  for (const auto& output : graph.output()) {
    bool is_present = false;
    for (const auto& entry : cache.entries) is_present |= entry.present == output.name();
    if (!is_present) {
      cache.logits_output = output.name();
      break;
    }
  }
  return cache;
}

}  // namespace onnxopt
