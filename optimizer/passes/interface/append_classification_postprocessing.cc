// append_classification_postprocessing: a classifier returns its class probabilities and the top k
// classes beside its logits (Olive's AppendPrePostProcessingOps), with ONNX's standard operators.
//
// Before:  outputs logits [N, C]
// After:   outputs logits [N, C] (kept), probabilities = Softmax(logits, -1) [N, C],
//          top_k_probabilities, top_k_indices = TopK(probabilities, min(k, C), -1) [N, k] (largest first)
#include <set>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

class AppendClassificationPostprocessingPass final : public Pass {
 public:
  absl::string_view name() const override { return "append_classification_postprocessing"; }
  absl::string_view description() const override {
    return "A classifier's logits also as softmax probabilities and its top k classes (new outputs; the logits stay)";
  }
  std::vector<ParamSpec> params() const override {
    return {{"output", ParamType::kString, "", "the logits output (default: the only float output of rank 2)"},
            {"top_k", ParamType::kInt, "5", "how many classes (at most the number of classes)"},
            {"prefix", ParamType::kString, "", "put before the new outputs' names (probabilities, top_k_...)"}};
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    if (params.GetInt("top_k") < 1)
      return absl::InvalidArgumentError("append_classification_postprocessing: top_k < 1");
    return absl::OkStatus();
  }
  bool is_model_pass() const override { return true; }
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }
  absl::Status RunOnGraph(Graph&, PassContext&) const override { return absl::OkStatus(); }

  absl::Status RunOnModel(onnx::ModelProto* model, PassContext& context) const override {
    onnx::GraphProto* graph = model->mutable_graph();
    const std::string& wanted = context.params().GetString("output");
    const onnx::ValueInfoProto* logits = nullptr;
    for (const auto& output : graph->output()) {
      const auto& type = output.type().tensor_type();
      const bool logits_like = type.shape().dim_size() == 2 && (type.elem_type() == onnx::TensorProto::FLOAT ||
                                                                type.elem_type() == onnx::TensorProto::FLOAT16);
      if (wanted.empty() ? logits_like : output.name() == wanted) {
        if (logits != nullptr && wanted.empty()) {
          return absl::InvalidArgumentError(
              "append_classification_postprocessing: more than one float output of rank 2; name the logits with "
              "`output`");
        }
        logits = &output;
      }
    }
    if (logits == nullptr) {
      return absl::InvalidArgumentError(
          wanted.empty() ? "append_classification_postprocessing: no float output of rank 2"
                         : absl::StrCat("append_classification_postprocessing: no output '", wanted, "'"));
    }
    const onnx::ValueInfoProto kept = *logits;
    const auto& logits_type = kept.type().tensor_type();
    if (logits_type.shape().dim_size() != 2 || (logits_type.elem_type() != onnx::TensorProto::FLOAT &&
                                                logits_type.elem_type() != onnx::TensorProto::FLOAT16)) {
      return absl::InvalidArgumentError(absl::StrCat("append_classification_postprocessing: output '", kept.name(),
                                                     "' is not declared as float logits [N, classes]"));
    }
    const auto& classes = logits_type.shape().dim(1);
    int64_t k = context.params().GetInt("top_k");
    if (classes.has_dim_value()) k = std::min(k, classes.dim_value());
    const std::string prefix = context.params().GetString("prefix");
    const std::string probabilities = prefix + "probabilities", top_values = prefix + "top_k_probabilities",
                      top_indices = prefix + "top_k_indices", k_name = prefix + "top_k_count";
    // The new names must be new: not an output, input, initializer or node output of the model.
    std::set<std::string> taken;
    for (const auto& value : graph->input()) taken.insert(value.name());
    for (const auto& value : graph->output()) taken.insert(value.name());
    for (const auto& tensor : graph->initializer()) taken.insert(tensor.name());
    for (const auto& node : graph->node()) taken.insert(node.output().begin(), node.output().end());
    for (const std::string& name : {probabilities, top_values, top_indices, k_name}) {
      if (taken.count(name) > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("append_classification_postprocessing: the model already has '", name, "'; set `prefix`"));
      }
    }
    onnx::NodeProto softmax = MakeNode("Softmax", prefix + "postprocess/softmax", {kept.name()}, {probabilities});
    *softmax.add_attribute() = MakeIntAttribute("axis", -1);
    *graph->add_node() = std::move(softmax);
    *graph->add_initializer() = MakeInt64Tensor(k_name, {k});
    onnx::NodeProto top =
        MakeNode("TopK", prefix + "postprocess/top_k", {probabilities, k_name}, {top_values, top_indices});
    *top.add_attribute() = MakeIntAttribute("axis", -1);
    *graph->add_node() = std::move(top);
    auto declare = [&](const std::string& name, int32_t type, bool top_k) {
      onnx::ValueInfoProto output;
      output.set_name(name);
      output.mutable_type()->mutable_tensor_type()->set_elem_type(type);
      auto* shape = output.mutable_type()->mutable_tensor_type()->mutable_shape();
      *shape->add_dim() = kept.type().tensor_type().shape().dim(0);
      if (top_k) {
        shape->add_dim()->set_dim_value(k);
      } else {
        *shape->add_dim() = classes;
      }
      *graph->add_output() = std::move(output);
    };
    const int32_t float_type = kept.type().tensor_type().elem_type();
    declare(probabilities, float_type, false);
    declare(top_values, float_type, true);
    declare(top_indices, onnx::TensorProto::INT64, true);
    context.CountRewrite();
    context.Note(absl::StrCat(kept.name(), ": softmax and the top ", k, " classes"));
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeAppendClassificationPostprocessingPass() {
  return std::make_unique<AppendClassificationPostprocessingPass>();
}

}  // namespace onnxopt
