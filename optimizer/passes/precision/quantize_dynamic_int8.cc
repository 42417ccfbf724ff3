// quantize_dynamic_int8: weights of float products to int8, activations quantized at run time
// (ONNX Runtime's dynamic quantization, in its fused DynamicQuantizeMatMul form).
//
// Before:  y = MatMul(x, W:f32[K,N])          (or Gemm, or Attention's packed Q|K|V weights)
// After:   y = DynamicQuantizeMatMul(x, Wq:int8[K,N], scale:f32[N])
//
// Weights are quantized symmetrically (zero point 0, range ±127) with one scale per output column by
// default (per_channel), else one per tensor: scale = max|W[:, n]| / 127, Wq = round(W / scale).
// The input is quantized per tensor to uint8 by the operator on every run.
//
// reduce_range (default "auto"): 7-bit weights (±63) where this CPU has no int8 dot products (VNNI):
// x86's AVX2 u8s8 kernel adds pairs of products in 16 bits and saturates on full-range weights (BERT's
// pooler output at cosine 0.96 instead of 0.9999 measured on an AVX2-only CPU, docs/precision.md).
// "true" and "false" choose regardless of the CPU: the result is for where it will run.
#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/precision/weight_products.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

class QuantizeDynamicInt8Pass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "quantize_dynamic_int8"; }
  absl::string_view description() const override {
    return "Quantize the constant weights of MatMul, Gemm and Attention to int8 (symmetric, per output column by "
           "default); activations are quantized at run time (ONNX Runtime's DynamicQuantizeMatMul)";
  }
  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> specs = {
        {"per_channel", ParamType::kBool, "true", "one scale per output column (else one per weight)"},
        {"reduce_range", ParamType::kString, "auto",
         "7-bit weights, which x86 CPUs without VNNI need to keep their 16-bit pair sums from saturating: "
         "auto (where this CPU has no VNNI), true or false"}};
    for (ParamSpec& spec : WeightProductParams()) specs.push_back(std::move(spec));
    return specs;
  }

  absl::Status ValidateParams(const PassParams& params) const override {
    const std::string& reduce_range = params.GetString("reduce_range");
    if (reduce_range != "auto" && reduce_range != "true" && reduce_range != "false") {
      return absl::InvalidArgumentError(absl::StrCat("reduce_range: '", reduce_range, "' is not auto, true or false"));
    }
    return absl::OkStatus();
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    const WeightProductOptions options = WeightProductOptionsFrom(context.params());
    const bool per_channel = context.params().GetBool("per_channel");
    const std::string& reduce_range = context.params().GetString("reduce_range");
    const bool seven_bits = reduce_range == "true" || (reduce_range == "auto" && !CpuHasInt8DotProducts());
    QuantizeWeightProducts(graph, context, shapes, options,
                           [&](Graph& g, PassContext& ctx, const std::string& input, const FloatWeight& weight,
                               const std::string& output, const Node* anchor) {
                             return Emit(g, ctx, input, weight, output, anchor, per_channel, seven_bits);
                           });
    return absl::OkStatus();
  }

 private:
  static bool Emit(Graph& graph, PassContext& context, const std::string& input, const FloatWeight& weight,
                   const std::string& output, const Node* anchor, bool per_channel, bool seven_bits) {
    std::optional<Int8Weight> quantized = QuantizeSymmetricInt8(weight, per_channel, seven_bits ? 63 : 127);
    if (!quantized) {
      context.Skip("left in float: weight has NaN or Inf");
      return false;
    }
    if (seven_bits) context.Count("seven_bit_weights", 1);
    const int64_t k = weight.k, n = weight.n;
    const std::vector<float>& scales = quantized->scales;
    const std::string base = graph.UniqueName(absl::StrCat(output, "_int8"));
    onnx::TensorProto weight_tensor =
        MakeRawTensor(absl::StrCat(base, "_weight"), onnx::TensorProto::INT8, {k, n},
                      std::string(reinterpret_cast<const char*>(quantized->values.data()), quantized->values.size()));
    onnx::TensorProto scale_tensor = MakeFloatTensor(
        absl::StrCat(base, "_scale"), per_channel ? std::vector<int64_t>{n} : std::vector<int64_t>{}, scales);
    onnx::NodeProto node = MakeNode("DynamicQuantizeMatMul", base, {input, weight_tensor.name(), scale_tensor.name()},
                                    {output}, "com.microsoft");
    context.Count("weight_bytes_after", static_cast<int64_t>(quantized->values.size() + scales.size() * sizeof(float)));
    graph.AddInitializer(std::move(weight_tensor));
    graph.AddInitializer(std::move(scale_tensor));
    graph.AddNode(std::move(node), anchor, /*after=*/false);
    context.RequireOpset("com.microsoft", 1);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeQuantizeDynamicInt8Pass() { return std::make_unique<QuantizeDynamicInt8Pass>(); }

}  // namespace onnxopt
