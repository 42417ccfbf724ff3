// convert_opset: converts the model's default-domain opset with onnx's version converter.
//
// Before:  opset_import ai.onnx 11, Squeeze(x) {axes=[0]}      After (target_opset=13):
//          opset_import ai.onnx 13, Squeeze(x, axes=[0] as an input)
// onnx 1.12 converts between opsets 1 and 17; models or targets past that are refused with a reason.
// The converter rebuilds the graph, so doc strings and value_info may change; outputs do not.
#include "absl/strings/str_cat.h"
#include "onnx/version_converter/convert.h"
#include "optimizer/failure.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

constexpr int kNewestConvertibleOpset = 17;

class ConvertOpsetPass final : public Pass {
 public:
  absl::string_view name() const override { return "convert_opset"; }
  absl::string_view description() const override {
    return "Convert the model to another default-domain opset with onnx's version converter (up to 17)";
  }
  std::vector<ParamSpec> params() const override {
    return {{"target_opset", ParamType::kInt, "0", "the opset to convert to (required)"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    const int64_t target = params.GetInt("target_opset");
    if (target < 1 || target > kNewestConvertibleOpset) {
      return absl::InvalidArgumentError(absl::StrCat("target_opset must be between 1 and ", kNewestConvertibleOpset));
    }
    return absl::OkStatus();
  }
  bool is_model_pass() const override { return true; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }
  absl::Status RunOnGraph(Graph&, PassContext&) const override { return absl::OkStatus(); }

  absl::Status RunOnModel(onnx::ModelProto* model, PassContext& context) const override {
    const int64_t target = context.params().GetInt("target_opset");
    const int64_t current = context.OpsetVersion("");
    if (current == target) return absl::OkStatus();
    if (current < 1 || current > kNewestConvertibleOpset) {
      context.Skip(absl::StrCat("model opset ", current, " is outside what onnx 1.12 converts"));
      return absl::OkStatus();
    }
    try {
      onnx::ModelProto converted = onnx::version_conversion::ConvertVersion(*model, static_cast<int>(target));
      *model = std::move(converted);
    } catch (const std::exception& e) {
      return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::OPSET_CONVERSION_FAILED,
                     absl::StrCat("from ", current, " to ", target, ": ", e.what()));
    }
    context.CountRewrite();
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeConvertOpsetPass() { return std::make_unique<ConvertOpsetPass>(); }

}  // namespace onnxopt
