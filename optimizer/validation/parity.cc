#include "optimizer/validation/parity.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "optimizer/failure.h"

namespace onnxopt {
namespace {

// Element values as doubles; false for element types that cannot be compared numerically.
bool ToDoubles(const Ort::Value& value, std::vector<double>* out) {
  auto info = value.GetTensorTypeAndShapeInfo();
  const size_t count = info.GetElementCount();
  out->resize(count);
  auto copy = [&](auto* data) {
    for (size_t i = 0; i < count; ++i) (*out)[i] = static_cast<double>(data[i]);
  };
  switch (info.GetElementType()) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: copy(value.GetTensorData<float>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: copy(value.GetTensorData<double>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: copy(value.GetTensorData<int64_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: copy(value.GetTensorData<int32_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: copy(value.GetTensorData<int16_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: copy(value.GetTensorData<int8_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: copy(value.GetTensorData<uint8_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: copy(value.GetTensorData<uint16_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: copy(value.GetTensorData<uint32_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: copy(value.GetTensorData<uint64_t>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: copy(value.GetTensorData<bool>()); return true;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: {
      const auto* data = value.GetTensorData<Ort::Float16_t>();
      for (size_t i = 0; i < count; ++i) (*out)[i] = data[i].ToFloat();
      return true;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: {
      const auto* data = value.GetTensorData<Ort::BFloat16_t>();
      for (size_t i = 0; i < count; ++i) (*out)[i] = data[i].ToFloat();
      return true;
    }
    default:
      return false;
  }
}

bool Valid(const v1::Tolerance& tolerance) {
  auto ok = [](double v) { return std::isfinite(v) && v >= 0; };
  return (!tolerance.has_atol() || ok(tolerance.atol())) && (!tolerance.has_rtol() || ok(tolerance.rtol()));
}

}  // namespace

bool AllClose(double actual, double expected, double atol, double rtol) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) && std::isnan(actual);
  if (std::isinf(expected) || std::isinf(actual)) return actual == expected;
  return std::fabs(actual - expected) <= atol + rtol * std::fabs(expected);
}

// 1 for two zero vectors (nothing to disagree on); 0 when `b` is NaN/Inf where `a` is finite;
// elements non-finite in both are left out.
double CosineSimilarity(const std::vector<double>& a, const std::vector<double>& b) {
  double dot = 0, norm_a = 0, norm_b = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(a[i]) && !std::isfinite(b[i])) return 0.0;
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    dot += a[i] * b[i];
    norm_a += a[i] * a[i];
    norm_b += b[i] * b[i];
  }
  if (norm_a == 0 && norm_b == 0) return 1.0;
  if (norm_a == 0 || norm_b == 0) return 0.0;
  return dot / (std::sqrt(norm_a) * std::sqrt(norm_b));
}

// Share of rows (runs of `classes` elements) whose first arg-max agrees.
double Top1Agreement(const std::vector<double>& want, const std::vector<double>& got, int64_t classes) {
  const size_t rows = want.size() / static_cast<size_t>(classes);
  if (rows == 0) return 1.0;
  size_t agree = 0;
  for (size_t row = 0; row < rows; ++row) {
    const auto begin = row * static_cast<size_t>(classes), end = begin + static_cast<size_t>(classes);
    const auto want_max = std::max_element(want.begin() + begin, want.begin() + end) - want.begin();
    const auto got_max = std::max_element(got.begin() + begin, got.begin() + end) - got.begin();
    agree += want_max == got_max;
  }
  return static_cast<double>(agree) / rows;
}

namespace {

template <typename T>
double LogSumExp(const T* x, size_t n) {
  const double top = *std::max_element(x, x + n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - top);
  return top + std::log(sum);
}

template <typename T>
double RowKl(const T* p, const T* q, size_t n) {
  const double log_zp = LogSumExp(p, n), log_zq = LogSumExp(q, n);
  double kl = 0;
  for (size_t i = 0; i < n; ++i) {
    const double log_p = p[i] - log_zp;
    kl += std::exp(log_p) * (log_p - (q[i] - log_zq));
  }
  return std::max(kl, 0.0);
}

template <typename T>
bool AllFinite(const T* x, size_t n) {
  return std::all_of(x, x + n, [](T v) { return std::isfinite(v); });
}

// Mean over rows of KL(softmax(want) || softmax(got)), rows with a non-finite value left out.
double MeanKlDivergence(const std::vector<double>& want, const std::vector<double>& got, int64_t classes) {
  const size_t n = static_cast<size_t>(classes), rows = want.size() / n;
  double total = 0;
  size_t counted = 0;
  for (size_t row = 0; row < rows; ++row) {
    const double* p = want.data() + row * n;
    const double* q = got.data() + row * n;
    if (!AllFinite(p, n) || !AllFinite(q, n)) continue;
    total += RowKl(p, q, n);
    ++counted;
  }
  return counted == 0 ? 0.0 : total / static_cast<double>(counted);
}

}  // namespace

double LogitsKlDivergence(const std::vector<float>& original, const std::vector<float>& optimized) {
  if (original.empty() || original.size() != optimized.size() || !AllFinite(original.data(), original.size()) ||
      !AllFinite(optimized.data(), optimized.size())) {
    return -1.0;
  }
  return RowKl(original.data(), optimized.data(), original.size());
}

void CompareOutput(const Ort::Value& expected, const Ort::Value& actual, double atol, double rtol,
                   v1::OutputParity* result, double min_cosine, double noise_bound, double max_kl) {
  result->set_atol(atol);
  result->set_rtol(rtol);
  result->set_noise_bound(noise_bound);
  if (!expected.IsTensor() || !actual.IsTensor()) {
    result->set_passed(expected.IsTensor() == actual.IsTensor());
    result->set_note("non-tensor output: not compared element-wise");
    return;
  }
  auto expected_info = expected.GetTensorTypeAndShapeInfo();
  auto actual_info = actual.GetTensorTypeAndShapeInfo();
  for (int64_t d : expected_info.GetShape()) result->add_shape(d);
  if (expected_info.GetShape() != actual_info.GetShape()) {
    result->set_passed(false);
    result->set_note(absl::StrCat("shape differs: original ", absl::StrJoin(expected_info.GetShape(), "x"),
                                  ", optimized ", absl::StrJoin(actual_info.GetShape(), "x")));
    return;
  }
  if (expected_info.GetElementType() != actual_info.GetElementType()) {
    result->set_passed(false);
    result->set_note("element type differs");
    return;
  }
  std::vector<double> want, got;
  if (!ToDoubles(expected, &want) || !ToDoubles(actual, &got)) {
    result->set_passed(false);
    result->set_note("element type cannot be compared");
    return;
  }
  double max_abs = 0, max_rel = 0;
  int64_t mismatches = 0, outside_tolerance = 0;
  bool introduced = false;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool finite_expected = std::isfinite(want[i]);
    if (finite_expected && !std::isfinite(got[i])) introduced = true;
    if (!AllClose(got[i], want[i], atol, rtol)) {
      ++outside_tolerance;
      if (!(std::fabs(got[i] - want[i]) <= noise_bound)) ++mismatches;
    }
    if (finite_expected && std::isfinite(got[i])) {
      const double abs_error = std::fabs(got[i] - want[i]);
      max_abs = std::max(max_abs, abs_error);
      max_rel = std::max(max_rel, abs_error / std::max(std::fabs(want[i]), 1e-12));
    }
  }
  result->set_elements(static_cast<int64_t>(want.size()));
  result->set_max_abs_error(max_abs);
  result->set_max_rel_error(max_rel);
  result->set_mismatch_fraction(want.empty() ? 0.0 : static_cast<double>(mismatches) / want.size());
  result->set_nan_or_inf_introduced(introduced);
  const std::vector<int64_t> shape = expected_info.GetShape();
  const bool is_float = expected_info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ||
                        expected_info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
                        expected_info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 ||
                        expected_info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
  result->set_cosine_similarity(CosineSimilarity(want, got));
  const int64_t classes = shape.empty() ? 0 : shape.back();
  // Classifier-shaped: [batch, classes], or logits of any rank (token classification, LM heads);
  // hidden states ([B, S, H]) are not judged by arg-max.
  const bool logits_name = absl::AsciiStrToLower(result->name()).find("logit") != std::string::npos;
  const bool classifier =
      is_float && (shape.size() == 2 || (shape.size() > 2 && logits_name)) && classes >= 2 && classes <= 100000;
  result->set_top1_agreement(classifier ? Top1Agreement(want, got, classes) : -1.0);
  const bool logits = classifier && logits_name;
  result->set_kl_divergence(logits ? MeanKlDivergence(want, got, classes) : -1.0);
  bool passed = mismatches == 0 && !introduced;
  if (passed) result->set_judged_by(outside_tolerance == 0 ? "tolerance" : "device noise");
  if (!passed && min_cosine > 0 && is_float && !introduced) {
    const bool top1 = !classifier || result->top1_agreement() >= kMinTop1Agreement;
    const bool by_kl = !top1 && logits && max_kl > 0 && result->kl_divergence() <= max_kl;
    passed = result->cosine_similarity() >= min_cosine && (top1 || by_kl);
    if (passed) {
      result->set_judged_by("agreement");
      result->set_note(absl::StrFormat(
          "outside atol/rtol, passed by agreement (cosine %.5f >= %.3f%s%s)", result->cosine_similarity(), min_cosine,
          classifier ? absl::StrFormat(", top-1 %.4f", result->top1_agreement()) : "",
          by_kl ? absl::StrFormat(" with KL divergence %.5f <= %.4f", result->kl_divergence(), max_kl) : ""));
    }
  }
  result->set_passed(passed);
}

std::string ModelPrecision(const onnx::ModelProto& model) {
  static const std::set<std::string> kQuantized = {
      "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
      "ConvInteger", "QAttention", "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearAdd",
      "QLinearMul"};
  bool fp16 = false, bf16 = false;
  auto note_type = [&](int32_t type) {
    fp16 |= type == onnx::TensorProto::FLOAT16;
    bf16 |= type == onnx::TensorProto::BFLOAT16;
  };
  for (const auto& node : model.graph().node()) {
    if (node.op_type() == "MatMulNBits") return "int4";
  }
  for (const auto& node : model.graph().node()) {
    if (kQuantized.count(node.op_type()) > 0) return "int8";
    if (node.op_type() == "Cast") {
      for (const auto& attribute : node.attribute()) {
        if (attribute.name() == "to") note_type(static_cast<int32_t>(attribute.i()));
      }
    }
  }
  for (const auto& tensor : model.graph().initializer()) note_type(tensor.data_type());
  for (const auto* values : {&model.graph().input(), &model.graph().output()}) {
    for (const auto& value : *values) note_type(value.type().tensor_type().elem_type());
  }
  return bf16 ? "bf16" : (fp16 ? "fp16" : "fp32");
}

Tolerance ToleranceFor(const v1::ValidationConfig& config, const std::string& name, const std::string& precision) {
  Tolerance tolerance;
  tolerance.source = precision;
  if (precision == "fp16") tolerance = {1e-2, 1e-2, precision};
  if (precision == "bf16") tolerance = {2e-2, 2e-2, precision};
  if (precision == "int8") tolerance = {5e-2, 5e-2, precision, 0.99, kDefaultMaxKlDivergence};
  if (precision == "int4") tolerance = {1e-1, 1e-1, precision, 0.98, kDefaultMaxKlDivergence};
  if (config.has_min_cosine_similarity()) tolerance.min_cosine = config.min_cosine_similarity();
  if (config.has_max_kl_divergence()) tolerance.max_kl = config.max_kl_divergence();
  auto apply = [&](const v1::Tolerance& given, const char* source) {
    if (given.has_atol()) tolerance.atol = given.atol();
    if (given.has_rtol()) tolerance.rtol = given.rtol();
    if (given.has_atol() || given.has_rtol()) tolerance.source = source;
  };
  auto by_precision = config.precision_tolerances().find(precision);
  if (by_precision != config.precision_tolerances().end()) apply(by_precision->second, "config");
  v1::Tolerance global;
  if (config.has_atol()) global.set_atol(config.atol());
  if (config.has_rtol()) global.set_rtol(config.rtol());
  apply(global, "config");
  auto by_output = config.output_tolerances().find(name);
  if (by_output != config.output_tolerances().end()) apply(by_output->second, "output");
  return tolerance;
}

std::string WorstOutput(const v1::ParityReport& parity) {
  for (const auto& output : parity.outputs()) {
    if (output.passed()) continue;
    if (!output.note().empty()) return absl::StrCat(output.name(), ": ", output.note());
    return absl::StrFormat("%s: %smax abs error %.4g, %.2f%% of elements outside tolerance, cosine %.6f%s%s",
                           output.name(), output.nan_or_inf_introduced() ? "NaN/Inf introduced, " : "",
                           output.max_abs_error(), 100 * output.mismatch_fraction(), output.cosine_similarity(),
                           output.top1_agreement() >= 0 ? absl::StrFormat(", top-1 %.4f", output.top1_agreement()) : "",
                           output.kl_divergence() >= 0 ? absl::StrFormat(", KL %.5f", output.kl_divergence()) : "");
  }
  if (parity.has_perplexity() && !parity.perplexity().passed()) {
    return absl::StrCat("supplied tokens: ", parity.perplexity().note());
  }
  return "no output failed";
}

absl::Status CheckValidationSettings(const v1::ValidationConfig& config) {
  v1::Tolerance global;
  if (config.has_atol()) global.set_atol(config.atol());
  if (config.has_rtol()) global.set_rtol(config.rtol());
  if (!Valid(global)) return absl::InvalidArgumentError("validation.atol and validation.rtol must be finite and >= 0");
  for (const auto& [name, tolerance] : config.output_tolerances()) {
    if (!Valid(tolerance)) {
      return absl::InvalidArgumentError(absl::StrCat("validation.output_tolerances['", name, "'] must be finite and >= 0"));
    }
  }
  static const std::set<std::string> kPrecisions = {"fp32", "fp16", "bf16", "int8", "int4"};
  for (const auto& [name, tolerance] : config.precision_tolerances()) {
    if (kPrecisions.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("validation.precision_tolerances: unknown precision '", name,
                                                     "' (known: fp32, fp16, bf16, int8, int4)"));
    }
    if (!Valid(tolerance)) {
      return absl::InvalidArgumentError(absl::StrCat("validation.precision_tolerances['", name, "'] must be finite and >= 0"));
    }
  }
  if (config.samples() < 0 || config.samples() > 100) {
    return absl::InvalidArgumentError("validation.samples must be between 1 and 100 (0 for the default)");
  }
  if (config.shapes_size() > 16) return absl::InvalidArgumentError("validation.shapes: at most 16 shape sets");
  auto check_dims = [](const google::protobuf::Map<std::string, int64_t>& dims) -> absl::Status {
    for (const auto& dim : dims) {
      // 0 is an empty dim: a decoder's past before the first step.
      if (dim.second < 0 || dim.second > (int64_t{1} << 20)) {
        return absl::InvalidArgumentError(absl::StrCat("dim_values['", dim.first, "'] must be between 0 and 2^20"));
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status status = check_dims(config.dim_values()); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("validation.", status.message()));
  }
  for (const auto& shape_set : config.shapes()) {
    if (absl::Status status = check_dims(shape_set.dim_values()); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("validation.shapes[].", status.message()));
    }
  }
  if (config.has_max_kl_divergence() && !(config.max_kl_divergence() >= 0)) {
    return absl::InvalidArgumentError("validation.max_kl_divergence must be >= 0");
  }
  if (config.has_min_cosine_similarity() &&
      !(config.min_cosine_similarity() >= 0 && config.min_cosine_similarity() <= 1)) {
    return absl::InvalidArgumentError("validation.min_cosine_similarity must be in [0, 1]");
  }
  if (!(config.noise_factor() == 0 || (config.noise_factor() >= 1 && config.noise_factor() <= 1000))) {
    return absl::InvalidArgumentError("validation.noise_factor must be between 1 and 1000 (0 for the default 2)");
  }
  if (!(config.mask_padding() >= 0 && config.mask_padding() < 1)) {
    return absl::InvalidArgumentError("validation.mask_padding must be in [0, 1)");
  }
  if (!v1::ParityFailureAction_IsValid(config.on_parity_failure()) ||
      !v1::OrtOptimizationLevel_IsValid(config.ort_optimization_level())) {
    return absl::InvalidArgumentError("validation.on_parity_failure or validation.ort_optimization_level is unknown");
  }
  return absl::OkStatus();
}

absl::StatusOr<ParityReference> BuildParityReference(Ort::Session& original, const onnx::ModelProto& original_model,
                                                     const v1::ValidationConfig& config,
                                                     const std::vector<SuppliedSample>& supplied, const RunContext& run,
                                                     v1::ParityReport* report) {
  ParityReference reference;
  reference.output_names = OutputNames(original);
  report->set_seed(config.seed());
  report->set_supplied_inputs(!supplied.empty());
  // Supplied inputs are one shape set of their own; generated ones follow the config's shape sets.
  const std::vector<DimValues> shape_sets = ParityShapeSets(config, !supplied.empty(), original_model);
  const int samples = !supplied.empty() ? static_cast<int>(supplied.size()) : (config.samples() > 0 ? config.samples() : 1);
  report->set_samples(samples);
  for (size_t shape_set = 0; shape_set < shape_sets.size(); ++shape_set) {
    v1::InputShapes* described = report->add_shape_sets();
    described->mutable_dim_values()->insert(shape_sets[shape_set].begin(), shape_sets[shape_set].end());
    for (int sample = 0; sample < samples; ++sample) {
      if (absl::Status stop = run.CheckNotCancelled("during validation"); !stop.ok()) return stop;
      absl::StatusOr<GeneratedInputs> inputs =
          GenerateInputs(original, original_model, config, shape_sets[shape_set], sample,
                         supplied.empty() ? nullptr : &supplied[static_cast<size_t>(sample)]);
      if (!inputs.ok()) return inputs.status();
      if (sample == 0) described->mutable_shapes()->insert(inputs->shapes.begin(), inputs->shapes.end());
      if (shape_set == 0 && sample == 0) {
        report->mutable_input_shapes()->insert(inputs->shapes.begin(), inputs->shapes.end());
        for (const auto& mask : inputs->padded_masks) report->add_padded_masks(mask);
        if (!inputs->padded_masks.empty()) report->set_mask_padding(MaskPadding(config));
      }
      auto expected = RunOnInputs(original, *inputs, reference.output_names);
      if (!expected.ok()) {
        return Failure(
            absl::StatusCode::kInvalidArgument, v1::ErrorReason::ORT_RUN_FAILED,
            absl::StrCat("ONNX Runtime cannot run the original model on ",
                         supplied.empty() ? "generated" : "the supplied", " inputs: ", expected.status().message()));
      }
      if (shape_set == 0 && sample == 0) {
        // A model that disagrees with itself (random ops, training-mode Dropout) cannot be judged.
        auto again = RunOnInputs(original, *inputs, reference.output_names);
        if (!again.ok()) {
          return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ORT_RUN_FAILED,
                         absl::StrCat(again.status().message()));
        }
        for (size_t i = 0; i < reference.output_names.size(); ++i) {
          v1::OutputParity self;
          // Loose enough for thread-level reordering, far tighter than what random operators change.
          CompareOutput((*expected)[i], (*again)[i], 1e-6, 1e-5, &self);
          if (!self.passed()) {
            return Failure(
                absl::StatusCode::kFailedPrecondition, v1::ErrorReason::NONDETERMINISTIC_MODEL,
                absl::StrCat(
                    "the original model's output '", reference.output_names[i],
                    "' differs between two runs on the same inputs (random operators or training-mode Dropout?), so "
                    "parity cannot be judged; set validation.skip to optimize it without a parity check"));
          }
        }
      }
      reference.sets.push_back({static_cast<int>(shape_set), sample, *std::move(inputs), *std::move(expected)});
    }
  }
  return reference;
}

namespace {

// The mask input's values as 0/1 per [b, t], or nullopt for another element type.
std::optional<std::vector<bool>> MaskKeeps(const Ort::Value& mask) {
  const auto info = mask.GetTensorTypeAndShapeInfo();
  const size_t count = info.GetElementCount();
  std::vector<bool> keeps(count);
  for (size_t i = 0; i < count; ++i) {
    switch (info.GetElementType()) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: keeps[i] = mask.GetTensorData<int64_t>()[i] != 0; break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: keeps[i] = mask.GetTensorData<int32_t>()[i] != 0; break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: keeps[i] = mask.GetTensorData<float>()[i] != 0; break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: keeps[i] = mask.GetTensorData<bool>()[i]; break;
      default: return std::nullopt;
    }
  }
  return keeps;
}

// Takes the expected values into `actual` at the positions the mask input `mask` zeroes, for a
// float output shaped [batch, sequence, ...] like the mask, so only valid positions are compared.
void KeepValidPositions(const ParityReference::InputSet& set, const std::string& mask, size_t output,
                        Ort::Value* actual) {
  const auto found = std::find(set.inputs.names.begin(), set.inputs.names.end(), mask);
  if (found == set.inputs.names.end()) return;
  const Ort::Value& mask_value = set.inputs.values[static_cast<size_t>(found - set.inputs.names.begin())];
  const auto mask_info = mask_value.GetTensorTypeAndShapeInfo();
  const auto info = actual->GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> mask_shape = mask_info.GetShape(), shape = info.GetShape();
  if (mask_shape.size() != 2 || shape.size() < 2 || shape[0] != mask_shape[0] || shape[1] != mask_shape[1] ||
      info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ||
      set.expected[output].GetTensorTypeAndShapeInfo().GetShape() != shape) {
    return;
  }
  const std::optional<std::vector<bool>> keeps = MaskKeeps(mask_value);
  if (!keeps) return;
  int64_t inner = 1;
  for (size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
  const float* expected = set.expected[output].GetTensorData<float>();
  float* values = actual->GetTensorMutableData<float>();
  for (int64_t position = 0; position < mask_shape[0] * mask_shape[1]; ++position) {
    if (!(*keeps)[static_cast<size_t>(position)]) {
      std::copy(expected + position * inner, expected + (position + 1) * inner, values + position * inner);
    }
  }
}

// Takes the expected values into `actual` where a decoder's query sees no key its mask keeps (every
// position up to its own masked: left padding longer than the past). Its row is a softmax over masked
// scores only, which no unmasked position reads; a fused operator that adds the mask where the original
// replaced the scores computes another one. Logits [B, S, ...] at such a query; a present ([B, N, T, D],
// or GPT-2's stacked [2, B, N, T, D]) at the positions before the row's first kept key, which only such
// queries wrote (or the past holds unchanged).
void KeepRowsMaskedEntirely(const ParityReference::InputSet& set, const CacheInterface& cache,
                            const std::string& name, size_t output, Ort::Value* actual) {
  auto input = [&](const std::string& wanted) -> const Ort::Value* {
    const auto found = std::find(set.inputs.names.begin(), set.inputs.names.end(), wanted);
    return found == set.inputs.names.end() ? nullptr
                                           : &set.inputs.values[static_cast<size_t>(found - set.inputs.names.begin())];
  };
  const Ort::Value* mask = cache.mask_input.empty() ? nullptr : input(cache.mask_input);
  const Ort::Value* ids = input(cache.ids_input);
  if (mask == nullptr || ids == nullptr) return;
  const std::vector<int64_t> mask_shape = mask->GetTensorTypeAndShapeInfo().GetShape();
  const std::vector<int64_t> ids_shape = ids->GetTensorTypeAndShapeInfo().GetShape();
  const std::optional<std::vector<bool>> keeps = MaskKeeps(*mask);
  if (!keeps || mask_shape.size() != 2 || ids_shape.size() != 2 || ids_shape[0] != mask_shape[0]) return;
  const int64_t batch = mask_shape[0], total = mask_shape[1], sequence = ids_shape[1];
  std::vector<int64_t> first_kept(static_cast<size_t>(batch), total);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = total - 1; t >= 0; --t) {
      if ((*keeps)[static_cast<size_t>(b * total + t)]) first_kept[static_cast<size_t>(b)] = t;
    }
  }
  const auto info = actual->GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> shape = info.GetShape();
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ||
      set.expected[output].GetTensorTypeAndShapeInfo().GetShape() != shape) {
    return;
  }
  // The axes of the rows and of the positions, and which positions of row b are masked entirely.
  int batch_axis = 0, position_axis = 1;
  std::function<bool(int64_t b, int64_t position)> masked_entirely;
  if (name == cache.logits_output) {
    if (shape.size() < 3 || shape[1] != sequence) return;
    masked_entirely = [&](int64_t b, int64_t s) { return total - sequence + s < first_kept[static_cast<size_t>(b)]; };
  } else {
    const auto entry = std::find_if(cache.entries.begin(), cache.entries.end(),
                                    [&](const CacheInterface::Entry& e) { return e.present == name; });
    if (entry == cache.entries.end() || (shape.size() != 4 && shape.size() != 5)) return;
    batch_axis = shape.size() == 5 ? 1 : 0;
    position_axis = entry->axis;
    masked_entirely = [&](int64_t b, int64_t t) { return t < first_kept[static_cast<size_t>(b)]; };
  }
  if (position_axis <= batch_axis || static_cast<size_t>(position_axis) >= shape.size() || shape[batch_axis] != batch) {
    return;
  }
  // Element strides of the batch and position axes.
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size() - 1; d > 0; --d) strides[d - 1] = strides[d] * shape[d];
  const float* expected = set.expected[output].GetTensorData<float>();
  float* values = actual->GetTensorMutableData<float>();
  const int64_t count = static_cast<int64_t>(info.GetElementCount());
  for (int64_t i = 0; i < count; ++i) {
    const int64_t b = i / strides[batch_axis] % shape[batch_axis];
    const int64_t position = i / strides[position_axis] % shape[position_axis];
    if (masked_entirely(b, position)) values[i] = expected[i];
  }
}

}  // namespace

double NoiseFactor(const v1::ValidationConfig& config) {
  return config.noise_factor() > 0 ? config.noise_factor() : kDefaultNoiseFactor;
}

absl::Status MeasureDeviceDeviation(Ort::Session& device_original, const RunContext& run, ParityReference* reference) {
  reference->device_deviation.assign(reference->output_names.size(), 0.0);
  for (const auto& set : reference->sets) {
    if (absl::Status stop = run.CheckNotCancelled("during validation"); !stop.ok()) return stop;
    auto actual = RunOnInputs(device_original, set.inputs, reference->output_names);
    if (!actual.ok()) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::ORT_RUN_FAILED,
                     absl::StrCat("ONNX Runtime cannot run the original model on the "
                                  "job's device: ",
                                  actual.status().message()));
    }
    for (size_t i = 0; i < reference->output_names.size(); ++i) {
      v1::OutputParity measured;
      CompareOutput(set.expected[i], (*actual)[i], 0, 0, &measured);
      reference->device_deviation[i] = std::max(reference->device_deviation[i], measured.max_abs_error());
    }
  }
  return absl::OkStatus();
}

absl::Status CompareWithReference(Ort::Session& candidate, const std::string& candidate_precision,
                                  const ParityReference& reference, const v1::ValidationConfig& config,
                                  const RunContext& run, v1::ParityReport* report, const Ort::RunOptions* run_options) {
  if (OutputNames(candidate) != reference.output_names) {
    return absl::InternalError("the optimized model's outputs differ from the original's");
  }
  report->clear_outputs();
  report->set_precision(candidate_precision);
  bool passed = true;
  for (const auto& set : reference.sets) {
    if (absl::Status stop = run.CheckNotCancelled("during validation"); !stop.ok()) return stop;
    auto actual = RunOnInputs(candidate, set.inputs, reference.output_names, run_options);
    if (!actual.ok()) {
      return absl::InternalError(absl::StrCat("ONNX Runtime cannot run the optimized model: ", actual.status().message()));
    }
    for (size_t i = 0; i < reference.output_names.size(); ++i) {
      const Tolerance tolerance = ToleranceFor(config, reference.output_names[i], candidate_precision);
      v1::OutputParity* output = report->add_outputs();
      output->set_name(reference.output_names[i]);
      output->set_sample(set.sample);
      output->set_shape_set(set.shape_set);
      output->set_tolerance_source(tolerance.source);
      if (!reference.valid_positions_of.empty()) KeepValidPositions(set, reference.valid_positions_of, i, &(*actual)[i]);
      if (reference.skip_rows_masked_entirely) {
        KeepRowsMaskedEntirely(set, *reference.skip_rows_masked_entirely, reference.output_names[i], i, &(*actual)[i]);
      }
      const double deviation = i < reference.device_deviation.size() ? reference.device_deviation[i] : 0.0;
      output->set_device_deviation(deviation);
      CompareOutput(set.expected[i], (*actual)[i], tolerance.atol, tolerance.rtol, output, tolerance.min_cosine,
                    NoiseFactor(config) * deviation, tolerance.max_kl);
      passed &= output->passed();
    }
  }
  report->set_passed(passed);
  return absl::OkStatus();
}

absl::Status CheckParity(const ParityPair& pair, const v1::ValidationConfig& config,
                         const std::vector<SuppliedSample>& supplied, const RunContext& run, v1::ParityReport* report) {
  absl::StatusOr<ParityReference> reference =
      BuildParityReference(pair.original, pair.original_model, config, supplied, run, report);
  if (!reference.ok()) return reference.status();
  if (pair.skip_rows_masked_entirely) {
    reference->skip_rows_masked_entirely = FindCacheInterface(pair.original_model.graph());
    report->set_rows_masked_entirely_skipped(reference->skip_rows_masked_entirely.has_value());
  }
  return CompareWithReference(pair.candidate, pair.candidate_precision, *reference, config, run, report,
                              pair.candidate_run_options);
}

}  // namespace onnxopt
