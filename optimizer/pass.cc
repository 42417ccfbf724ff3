#include "optimizer/pass.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace onnxopt {
namespace {
const ActivationRanges kNoRanges;
}  // namespace

absl::string_view ParamTypeName(ParamType type) {
  switch (type) {
    case ParamType::kInt: return "int";
    case ParamType::kDouble: return "double";
    case ParamType::kBool: return "bool";
    case ParamType::kString: return "string";
  }
  return "unknown";
}

absl::StatusOr<ParamValue> ParamValueFromText(ParamType type, absl::string_view text) {
  switch (type) {
    case ParamType::kInt: {
      int64_t value;
      if (absl::SimpleAtoi(text, &value)) return ParamValue(value);
      break;
    }
    case ParamType::kDouble: {
      double value;
      if (absl::SimpleAtod(text, &value)) return ParamValue(value);
      break;
    }
    case ParamType::kBool: {
      bool value;
      if (absl::SimpleAtob(text, &value)) return ParamValue(value);
      break;
    }
    case ParamType::kString:
      return ParamValue(std::string(text));
  }
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a valid ", ParamTypeName(type)));
}

PassContext::PassContext(const PassParams& params, const onnx::ModelProto& model, const ShapeInfo* shapes,
                         const ModelHints* hints, const ActivationRanges* activation_ranges)
    : params_(params),
      model_(model),
      shapes_(shapes),
      hints_(hints != nullptr ? *hints : ModelHints()),
      activation_ranges_(activation_ranges != nullptr ? activation_ranges : &kNoRanges) {
  for (const auto& opset : model.opset_import()) {
    const std::string domain = opset.domain() == "ai.onnx" ? "" : opset.domain();
    opsets_[domain] = opset.version();
  }
}

int64_t PassContext::OpsetVersion(absl::string_view domain) const {
  if (domain == "ai.onnx") domain = "";
  auto it = opsets_.find(std::string(domain));
  return it == opsets_.end() ? 0 : it->second;
}

absl::Status ShapedPass::RunOnGraph(Graph& graph, PassContext& context) const {
  if (context.shapes() == nullptr) {
    return absl::InternalError(absl::StrCat("pass '", name(), "' reads shapes, but none were inferred for it"));
  }
  return RunWithShapes(graph, context, *context.shapes());
}

}  // namespace onnxopt
