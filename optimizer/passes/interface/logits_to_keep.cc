// logits_to_keep: a decoder computes its output projection (lm_head) only for the last k positions
// when the caller asks, as transformers' `logits_to_keep` does in generate(): a prompt's prefill needs
// the last position's logits alone, and over a large vocabulary the projection of every position is a
// quarter of the prefill (Qwen2-0.5B's shape: 151936 x 896 per token).
//
// Before:  hidden [B, S, H] -> MatMul(W) (or MatMulNBits) -> (Cast, Tanh, Softmax, a constant bias or scale)* -> logits [B, S, V]
// After:   inputs += logits_to_keep: int64 [1], default 0 (an initializer of the same name)
//          hidden -> Slice(starts = -logits_to_keep, ends = INT64_MAX, axes = [1]) -> MatMul(W) -> ... -> logits [B, K, V]
// Fed nothing (or 0), the model computes every position exactly as before: the input is optional and
// every existing caller keeps working. Fed k >= 1, it returns the last k positions' logits. Only steps
// that work position by position may follow the projection (a Reshape or Transpose there is left
// alone, with the reason). Run in passesBefore, the job validates and times the model with it (the
// generation benchmark feeds 1, as a generation loop does); in passesAfter it comes after both.
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "optimizer/cache_interface.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

// Whether `tensor` broadcasts against [B, S, V] without reaching the positions: every axis but the
// last is 1 (a scalar, a [V] bias, a [1, 1, V] scale).
bool PositionFree(const onnx::TensorProto& tensor) {
  for (int i = 0; i + 1 < tensor.dims_size(); ++i) {
    if (tensor.dims(i) != 1) return false;
  }
  return true;
}

class LogitsToKeepPass final : public Pass {
 public:
  absl::string_view name() const override { return "logits_to_keep"; }
  absl::string_view description() const override {
    return "A decoder's output projection only for the last k positions when fed logits_to_keep = k (a new optional "
           "input, default 0: every position, as before): a generation prefill needs the last position alone";
  }
  std::vector<ParamSpec> params() const override {
    return {{"output", ParamType::kString, "",
             "the logits output (default: the key/value cache's logits, else the only float output of rank 3)"}};
  }
  ShapeEffect shape_effect() const override { return ShapeEffect::kInvalidatesAlways; }

  absl::Status RunOnGraph(Graph& graph, PassContext& context) const override {
    if (!graph.is_main()) return absl::OkStatus();
    if (context.OpsetVersion("") < 10) {
      context.Skip("opset < 10: Slice takes its bounds as attributes there");
      return absl::OkStatus();
    }
    if (graph.IsGraphInput(kLogitsToKeepInput) || graph.IsDefinedHere(kLogitsToKeepInput)) {
      context.Skip("the model already has a value named logits_to_keep");
      return absl::OkStatus();
    }
    absl::StatusOr<int> output_index = LogitsOutput(graph, context.params().GetString("output"));
    if (!output_index.ok()) return output_index.status();
    if (*output_index < 0) {
      context.Skip("no float logits output of rank 3 ([batch, sequence, vocabulary])");
      return absl::OkStatus();
    }
    const std::string logits = graph.proto().output(*output_index).name();
    Node* projection = nullptr;
    if (absl::Status walked = WalkToProjection(graph, logits, context.OpsetVersion(""), &projection); !walked.ok()) {
      context.Skip(walked.message());
      return absl::OkStatus();
    }
    onnx::ValueInfoProto input;
    input.set_name(kLogitsToKeepInput);
    input.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    input.mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
    graph.AddInitializer(MakeInt64Tensor(kLogitsToKeepInput, {0}));
    graph.AddGraphInput(std::move(input));

    const std::string base = graph.UniqueName(kLogitsToKeepInput);
    const std::string starts = base + "_starts", ends = base + "_ends", axes = base + "_axes", kept = base + "_hidden";
    graph.AddInitializer(MakeInt64Tensor(ends, {std::numeric_limits<int64_t>::max()}));
    graph.AddInitializer(MakeInt64Tensor(axes, {1}));
    Node* negate = graph.AddNode(MakeNode("Neg", base + "_negate", {kLogitsToKeepInput}, {starts}), projection,
                                 /*after=*/false);
    graph.AddNode(MakeNode("Slice", base + "_slice", {projection->input(0), starts, ends, axes}, {kept}), negate);
    graph.SetInput(projection, 0, kept);
    // The output's second axis is now the kept positions: S unless logits_to_keep says fewer.
    auto* dim = graph.mutable_proto()->mutable_output(*output_index)->mutable_type()->mutable_tensor_type()
                    ->mutable_shape()->mutable_dim(1);
    dim->Clear();
    dim->set_dim_param("logits_positions");
    context.CountRewrite();
    context.Note(absl::StrCat(logits, ": its projection (", projection->name(), ") reads the last logits_to_keep positions"));
    return absl::OkStatus();
  }

 private:
  // The index of the logits output: the one named, else the cache interface's, else the only float
  // output of rank 3; -1 when there is none (an error when `wanted` names no output).
  static absl::StatusOr<int> LogitsOutput(const Graph& graph, const std::string& wanted) {
    const auto& outputs = graph.proto().output();
    auto rank3_float = [](const onnx::ValueInfoProto& value) {
      const auto& type = value.type().tensor_type();
      return type.has_shape() && type.shape().dim_size() == 3 &&
             (type.elem_type() == onnx::TensorProto::FLOAT || type.elem_type() == onnx::TensorProto::FLOAT16 ||
              type.elem_type() == onnx::TensorProto::BFLOAT16);
    };
    std::string name = wanted;
    if (name.empty()) {
      if (std::optional<CacheInterface> cache = FindCacheInterface(graph.proto())) name = cache->logits_output;
    }
    int found = -1;
    for (int i = 0; i < outputs.size(); ++i) {
      if (!name.empty() ? outputs[i].name() == name : rank3_float(outputs[i])) {
        if (found >= 0) return -1;  // several candidates and none named: nothing to choose from
        found = i;
      }
    }
    if (!wanted.empty() && found < 0) {
      return absl::InvalidArgumentError(absl::StrCat("logits_to_keep: the model has no output '", wanted, "'"));
    }
    if (found >= 0 && !rank3_float(outputs[found])) return -1;
    return found;
  }

  // Follows `logits` back through position-wise steps to the MatMul that projects the hidden states;
  // the reason as the error where the path is not position-wise or feeds anything else.
  static absl::Status WalkToProjection(const Graph& graph, const std::string& logits, int64_t opset,
                                       Node** projection) {
    // Before opset 13 Softmax's axis defaults to 1 and flattens from there: [B, S * V], across positions.
    const int64_t softmax_default_axis = opset >= 13 ? -1 : 1;
    static const std::set<std::string> kUnary = {"Cast", "Identity", "Tanh"};
    static const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div"};
    if (!graph.Readers(logits).empty()) {
      return absl::FailedPreconditionError("nodes of the model read the logits too");
    }
    std::string value = logits;
    for (int steps = 0; steps < 16; ++steps) {
      Node* producer = graph.Producer(value);
      if (producer != nullptr && producer->domain() == "com.microsoft" && producer->op_type() == "MatMulNBits") {
        *projection = producer;  // quantized already (run in passesAfter): [.., K] x packed [N, K] rows
        return absl::OkStatus();
      }
      if (producer == nullptr || !producer->domain().empty()) {
        return absl::FailedPreconditionError("the logits are not computed by a MatMul over the hidden states");
      }
      const std::string op(producer->op_type());
      if (op == "MatMul") {
        const onnx::TensorProto* weight = ConstantTensor(graph, producer->input(1));
        if (weight == nullptr || weight->dims_size() != 2) {
          return absl::FailedPreconditionError("the output projection's weight is not a constant matrix");
        }
        *projection = producer;
        return absl::OkStatus();
      }
      std::string next;
      if (kUnary.count(op) > 0) {
        next = producer->input(0);
      } else if ((op == "Softmax" || op == "LogSoftmax") &&
                 (producer->GetAttributeInt("axis", softmax_default_axis) == -1 ||
                  producer->GetAttributeInt("axis", softmax_default_axis) == 2)) {
        next = producer->input(0);
      } else if (kBinary.count(op) > 0 && producer->input_size() == 2) {
        const onnx::TensorProto* first = ConstantTensor(graph, producer->input(0));
        const onnx::TensorProto* second = ConstantTensor(graph, producer->input(1));
        const onnx::TensorProto* constant = first != nullptr ? first : second;
        if ((first == nullptr) == (second == nullptr) || !PositionFree(*constant)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "a ", op, " after the projection does not take a constant that is the same at every position"));
        }
        next = first != nullptr ? producer->input(1) : producer->input(0);
      } else {
        return absl::FailedPreconditionError(absl::StrCat(
            "a ", op, " after the projection may mix positions (only casts, tanh, softmax and constant bias or scale "
            "may follow it)"));
      }
      value = next;
      // Readers of the next value: exactly the node just walked through.
      if (graph.Readers(value).size() != 1) {
        return absl::FailedPreconditionError("a value between the projection and the logits has other readers");
      }
      if (graph.IsGraphOutput(value)) {
        return absl::FailedPreconditionError("a value between the projection and the logits is an output too");
      }
    }
    return absl::FailedPreconditionError("more than 16 steps between the projection and the logits");
  }
};

}  // namespace

std::unique_ptr<Pass> MakeLogitsToKeepPass() { return std::make_unique<LogitsToKeepPass>(); }

}  // namespace onnxopt
