// fix_dynamic_dims: gives named dynamic dimensions fixed values (Olive's DynamicToFixedShape), so
// shape inference, constant folding and runtimes can specialize the model.
//
// Before:  input_ids: [batch, sequence]        After (dims = "batch=1,sequence=128"):  input_ids: [1, 128]
// Every inputs', outputs' and value_info's dimension with a listed name is rewritten; others stay.
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "optimizer/passes/passes.h"

namespace onnxopt {
namespace {

absl::StatusOr<std::map<std::string, int64_t>> ParseDims(const std::string& text) {
  std::map<std::string, int64_t> dims;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string name(absl::StripAsciiWhitespace(parts.first));
    int64_t value = 0;
    if (name.empty() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts.second), &value) || value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("dims: '", item, "' is not NAME=POSITIVE_INTEGER"));
    }
    dims[name] = value;
  }
  if (dims.empty()) return absl::InvalidArgumentError("dims: give at least one NAME=VALUE, e.g. \"batch=1\"");
  return dims;
}

class FixDynamicDimsPass final : public Pass {
 public:
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }
  absl::string_view name() const override { return "fix_dynamic_dims"; }
  absl::string_view description() const override {
    return "Set named dynamic dimensions to fixed values (e.g. dims=\"batch=1,sequence=128\")";
  }
  std::vector<ParamSpec> params() const override {
    return {{"dims", ParamType::kString, "", "comma-separated NAME=VALUE pairs"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    return ParseDims(params.GetString("dims")).status();
  }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    auto dims = ParseDims(context.params().GetString("dims"));
    if (!dims.ok()) return dims.status();
    onnx::GraphProto* proto = graph.mutable_proto();
    for (auto* values : {proto->mutable_input(), proto->mutable_output(), proto->mutable_value_info()}) {
      for (auto& value : *values) {
        if (!value.type().has_tensor_type() || !value.type().tensor_type().has_shape()) continue;
        for (auto& dim : *value.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
          auto it = dim.has_dim_param() ? dims->find(dim.dim_param()) : dims->end();
          if (it == dims->end()) continue;
          dim.set_dim_value(it->second);  // clears dim_param (oneof)
          context.CountRewrite();
        }
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeFixDynamicDimsPass() { return std::make_unique<FixDynamicDimsPass>(); }

}  // namespace onnxopt
