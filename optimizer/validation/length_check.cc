#include "optimizer/validation/length_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "optimizer/validation/input_generator.h"
#include "optimizer/validation/parity.h"

namespace onnxopt {
namespace {

size_t ElementBytes(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return 1;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return 8;
    default: return 0;
  }
}

// A copy of `value` whose `axis` has `length` positions, position p taken from position from(p).
std::optional<Ort::Value> Remap(const Ort::Value& value, int axis, int64_t length,
                                const std::function<int64_t(int64_t)>& from) {
  const auto info = value.GetTensorTypeAndShapeInfo();
  const size_t element = ElementBytes(info.GetElementType());
  std::vector<int64_t> shape = info.GetShape();
  if (element == 0 || axis < 0 || axis >= static_cast<int>(shape.size())) return std::nullopt;
  int64_t outer = 1, inner = static_cast<int64_t>(element);
  for (int i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t old_length = shape[axis];
  shape[axis] = length;
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value made = Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), info.GetElementType());
  const char* source = static_cast<const char*>(value.GetTensorRawData());
  char* target = static_cast<char*>(made.GetTensorMutableRawData());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t p = 0; p < length; ++p) {
      const int64_t q = from(p);
      if (q < 0 || q >= old_length) return std::nullopt;
      std::memcpy(target + (o * length + p) * inner, source + (o * old_length + q) * inner, static_cast<size_t>(inner));
    }
  }
  return made;
}

std::optional<Ort::Value> Copy(const Ort::Value& value) {
  const auto info = value.GetTensorTypeAndShapeInfo();
  const size_t element = ElementBytes(info.GetElementType());
  if (element == 0) return std::nullopt;
  const std::vector<int64_t> shape = info.GetShape();
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value made = Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), info.GetElementType());
  std::memcpy(made.GetTensorMutableRawData(), value.GetTensorRawData(), info.GetElementCount() * element);
  return made;
}

// Positions `from` and later of `axis` set to zero (a mask that stops at `from`).
void ZeroFrom(Ort::Value* value, int axis, int64_t from) {
  const auto info = value->GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> shape = info.GetShape();
  int64_t outer = 1, inner = static_cast<int64_t>(ElementBytes(info.GetElementType()));
  for (int i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  char* data = static_cast<char*>(value->GetTensorMutableRawData());
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t begin = (o * shape[axis] + from) * inner, end = (o + 1) * shape[axis] * inner;
    if (end > begin) std::memset(data + begin, 0, static_cast<size_t>(end - begin));
  }
}

bool IsMaskName(const std::string& name) { return absl::StrContains(absl::AsciiStrToLower(name), "mask"); }

// The inputs with every input that carries the dim remapped along its axis (others copied).
std::optional<GeneratedInputs> RemapInputs(const GeneratedInputs& inputs, const FreedDim& dim, int64_t length,
                                           const std::function<int64_t(const std::string&, int64_t)>& from) {
  GeneratedInputs made;
  made.names = inputs.names;
  for (size_t i = 0; i < inputs.names.size(); ++i) {
    auto axis = dim.input_axes.find(inputs.names[i]);
    const std::string& name = inputs.names[i];
    std::optional<Ort::Value> value =
        axis == dim.input_axes.end()
            ? Copy(inputs.values[i])
            : Remap(inputs.values[i], axis->second, length, [&](int64_t p) { return from(name, p); });
    if (!value) return std::nullopt;
    made.values.push_back(std::move(*value));
  }
  return made;
}

// The axis of `output` in the result that carries the dim, or -1.
int OutputAxis(const onnx::ModelProto& optimized, const std::string& output, const std::string& dim) {
  for (const auto& value : optimized.graph().output()) {
    if (value.name() != output) continue;
    const auto& dims = value.type().tensor_type().shape().dim();
    for (int i = 0; i < dims.size(); ++i) {
      if (dims[i].dim_param() == dim) return i;
    }
  }
  return -1;
}

// False, with the reason in `check`, when an output that carries the dim lacks `length` positions.
bool HasLength(const onnx::ModelProto& optimized, const std::string& output, const Ort::Value& value,
               const FreedDim& dim, int64_t length, v1::LengthCheck* check) {
  const int axis = OutputAxis(optimized, output, dim.name);
  const std::vector<int64_t> shape = value.GetTensorTypeAndShapeInfo().GetShape();
  if (axis < 0 || (axis < static_cast<int>(shape.size()) && shape[axis] == length)) return true;
  check->set_note(absl::StrCat(output, " does not have ", length, " positions"));
  return false;
}

bool AllFinite(const Ort::Value& value) {
  const auto info = value.GetTensorTypeAndShapeInfo();
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return true;
  const float* data = value.GetTensorData<float>();
  for (size_t i = 0; i < info.GetElementCount(); ++i) {
    if (!std::isfinite(data[i])) return false;
  }
  return true;
}

// The first `length` positions of an output along `axis` (the whole output for axis -1).
std::optional<Ort::Value> Prefix(const Ort::Value& value, int axis, int64_t length) {
  if (axis < 0) return Copy(value);
  return Remap(value, axis, length, [](int64_t p) { return p; });
}

void CheckShorter(Ort::Session& original, Ort::Session& optimized, const onnx::ModelProto& optimized_model,
                  const GeneratedInputs& inputs, const std::vector<std::string>& outputs, const FreedDim& dim,
                  int64_t length, const std::string& precision, const v1::ValidationConfig& config,
                  v1::LengthCheck* check) {
  const int64_t exported = dim.exported;
  // A: masks stop at `length`; B: the same with every other input past `length` changed.
  auto masked = RemapInputs(inputs, dim, exported, [](const std::string&, int64_t p) { return p; });
  auto changed = RemapInputs(inputs, dim, exported, [&](const std::string& name, int64_t p) {
    return p < length || IsMaskName(name) ? p : (p - length) % length;
  });
  if (!masked || !changed) {
    check->set_note("an input's type cannot be sliced here");
    return;
  }
  for (GeneratedInputs* set : {&*masked, &*changed}) {
    for (size_t i = 0; i < set->names.size(); ++i) {
      auto axis = dim.input_axes.find(set->names[i]);
      if (axis != dim.input_axes.end() && IsMaskName(set->names[i])) ZeroFrom(&set->values[i], axis->second, length);
    }
  }
  auto shorter = RemapInputs(*masked, dim, length, [](const std::string&, int64_t p) { return p; });
  auto expected = RunOnInputs(original, *masked, outputs);
  auto probe = RunOnInputs(original, *changed, outputs);
  if (!expected.ok() || !probe.ok() || !shorter) {
    check->set_note(absl::StrCat("the original does not run on the masked inputs: ",
                                 (!expected.ok() ? expected.status() : probe.status()).message()));
    return;
  }
  auto actual = RunOnInputs(optimized, *shorter, outputs);
  check->set_ran(actual.ok());
  if (!actual.ok()) {
    check->set_passed(false);
    check->set_note(absl::StrCat("the result does not run at ", length, ": ", actual.status().message()));
    return;
  }
  bool passed = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!HasLength(optimized_model, outputs[i], (*actual)[i], dim, length, check)) {
      passed = false;
      continue;
    }
    const int axis = OutputAxis(optimized_model, outputs[i], dim.name);
    auto reference = Prefix((*expected)[i], axis, length);
    auto moved = Prefix((*probe)[i], axis, length);
    if (!reference || !moved) {
      check->add_uncompared_outputs(outputs[i]);
      continue;
    }
    v1::OutputParity independence;
    CompareOutput(*reference, *moved, kDefaultAtol, kDefaultRtol, &independence);
    if (!independence.passed()) {
      check->add_uncompared_outputs(outputs[i]);  // its first positions depend on the later ones
      continue;
    }
    const Tolerance tolerance = ToleranceFor(config, outputs[i], precision);
    v1::OutputParity compared;
    CompareOutput(*reference, (*actual)[i], tolerance.atol, tolerance.rtol, &compared, tolerance.min_cosine, 0,
                  tolerance.max_kl);
    check->add_compared_outputs(outputs[i]);
    check->set_max_abs_error(std::max(check->max_abs_error(), compared.max_abs_error()));
    if (!compared.passed()) {
      passed = false;
      check->set_note(absl::StrFormat("%s differs from the original on the first %d positions: max abs error %.4g",
                                      outputs[i], length, compared.max_abs_error()));
    }
  }
  check->set_passed(passed);
}

void CheckLonger(Ort::Session& optimized, const onnx::ModelProto& optimized_model, const GeneratedInputs& inputs,
                 const std::vector<std::string>& outputs, const FreedDim& dim, int64_t length, v1::LengthCheck* check) {
  auto longer = RemapInputs(inputs, dim, length, [&](const std::string&, int64_t p) { return p % dim.exported; });
  if (!longer) {
    check->set_note("an input's type cannot be extended here");
    return;
  }
  auto actual = RunOnInputs(optimized, *longer, outputs);
  check->set_ran(actual.ok());
  if (!actual.ok()) {
    // A model whose tables stop at the exported length cannot run longer; that is not the rewrite.
    check->set_passed(true);
    check->set_note(absl::StrCat("does not run at ", length, " (the model's own limit?): ", actual.status().message()));
    return;
  }
  bool passed = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!HasLength(optimized_model, outputs[i], (*actual)[i], dim, length, check)) {
      passed = false;
    } else if (!AllFinite((*actual)[i])) {
      passed = false;
      check->set_note(absl::StrCat(outputs[i], " has NaN or Inf at ", length));
    }
    check->add_uncompared_outputs(outputs[i]);
  }
  check->set_passed(passed);
}

}  // namespace

std::vector<FreedDim> FreedDims(const onnx::ModelProto& original, const onnx::ModelProto& optimized) {
  std::map<std::string, FreedDim> found;
  std::set<std::string> inconsistent;
  for (const auto& before : original.graph().input()) {
    for (const auto& after : optimized.graph().input()) {
      if (after.name() != before.name()) continue;
      const auto& old_dims = before.type().tensor_type().shape().dim();
      const auto& new_dims = after.type().tensor_type().shape().dim();
      if (old_dims.size() != new_dims.size()) continue;
      for (int i = 0; i < old_dims.size(); ++i) {
        if (old_dims[i].dim_value() <= 0 || new_dims[i].dim_param().empty()) continue;
        FreedDim& dim = found[new_dims[i].dim_param()];
        if (dim.exported != 0 && dim.exported != old_dims[i].dim_value()) inconsistent.insert(new_dims[i].dim_param());
        dim.name = new_dims[i].dim_param();
        dim.exported = old_dims[i].dim_value();
        dim.input_axes[before.name()] = i;
      }
    }
  }
  std::vector<FreedDim> dims;
  for (auto& [name, dim] : found) {
    if (inconsistent.count(name) == 0) dims.push_back(std::move(dim));
  }
  return dims;
}

absl::Status CheckFreedLengths(Ort::Session& original, const onnx::ModelProto& original_model, Ort::Session& optimized,
                               const onnx::ModelProto& optimized_model, const std::string& precision,
                               const v1::ValidationConfig& config, v1::ParityReport* report) {
  const std::vector<FreedDim> dims = FreedDims(original_model, optimized_model);
  if (dims.empty()) return absl::OkStatus();
  absl::StatusOr<GeneratedInputs> inputs = GenerateInputs(original, original_model, config, 0);
  if (!inputs.ok()) return inputs.status();
  const std::vector<std::string> outputs = OutputNames(original);
  for (const FreedDim& dim : dims) {
    for (const int64_t length : {dim.exported / 2, dim.exported * 2}) {
      if (length < 1) continue;
      v1::LengthCheck* check = report->add_lengths();
      check->set_dim(dim.name);
      check->set_exported(dim.exported);
      check->set_length(length);
      if (length < dim.exported) {
        CheckShorter(original, optimized, optimized_model, *inputs, outputs, dim, length, precision, config, check);
      } else {
        CheckLonger(optimized, optimized_model, *inputs, outputs, dim, length, check);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxopt
