// quantize_static_int8: float products to int8 in QDQ form, activations with calibrated ranges.
//
// Before:  y = MatMul(x, W:f32[K,N])          (or Gemm, or Attention's packed Q|K|V weights)
// After:   xq = QuantizeLinear(x, sx, zx:u8)              (one pair per activation, shared by its readers)
//          y  = MatMul(DequantizeLinear(xq, sx, zx),
//                      DequantizeLinear(Wq:i8[K,N], sw[N], 0, axis=1))
//
// The QDQ form is the portable one: ONNX Runtime's CPU provider fuses it into integer kernels (as fast
// as DynamicQuantizeMatMul in the precision benchmark), and GPU runtimes such as TensorRT build int8
// engines from it (not tested here: no GPU). The activation's range [lo, hi] comes from
// calibration (the pipeline's activation ranges, PassContext::activation_ranges), widened to
// hold 0 so that padding zeros stay exact: scale = (hi - lo) / 255, zx = round(-lo / scale).
// Weights are symmetric int8 as in quantize_dynamic_int8 (per output column from opset 13, whose
// DequantizeLinear has `axis`). A product whose activation was not calibrated stays float.
#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/precision/weight_products.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

class QuantizeStaticInt8Pass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "quantize_static_int8"; }
  absl::string_view description() const override {
    return "Quantize MatMul, Gemm and Attention products to int8 in QDQ form: weights symmetric (per output column), "
           "activations uint8 with the pipeline's calibrated ranges";
  }
  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> specs = {
        {"per_channel", ParamType::kBool, "true", "one weight scale per output column (opset 13 and later)"}};
    for (ParamSpec& spec : WeightProductParams()) specs.push_back(std::move(spec));
    return specs;
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    if (context.OpsetVersion("") < 10) {
      context.Skip("left in float: QuantizeLinear/DequantizeLinear need opset 10");
      return absl::OkStatus();
    }
    const WeightProductOptions options = WeightProductOptionsFrom(context.params());
    const bool per_channel = context.params().GetBool("per_channel") && context.OpsetVersion("") >= 13;
    const ActivationRanges& ranges = context.activation_ranges();
    std::map<std::string, std::string> dequantized;  // activation -> its Q/DQ pair's output
    QuantizeWeightProducts(graph, context, shapes, options,
                           [&](Graph& g, PassContext& ctx, const std::string& input, const FloatWeight& weight,
                               const std::string& output, const Node* anchor) {
                             auto range = ranges.find(input);
                             if (range == ranges.end()) {
                               ctx.Skip("left in float: activation not calibrated");
                               return false;
                             }
                             if (!std::isfinite(range->second.low) || !std::isfinite(range->second.high) ||
                                 range->second.low > range->second.high) {
                               ctx.Skip("left in float: calibrated range not finite");
                               return false;
                             }
                             std::optional<Int8Weight> quantized = QuantizeSymmetricInt8(weight, per_channel);
                             if (!quantized) {
                               ctx.Skip("left in float: weight has NaN or Inf");
                               return false;
                             }
                             auto [pair, fresh] = dequantized.try_emplace(input);
                             if (fresh) pair->second = EmitActivation(g, input, range->second, anchor);
                             EmitProduct(g, ctx, pair->second, weight, *quantized, output, anchor, per_channel);
                             return true;
                           });
    return absl::OkStatus();
  }

 private:
  // QuantizeLinear -> DequantizeLinear of `input`; returns the dequantized value.
  static std::string EmitActivation(Graph& graph, const std::string& input, ValueRange range, const Node* anchor) {
    const float low = std::min(range.low, 0.0f), high = std::max(range.high, 0.0f);
    float scale = (high - low) / 255.0f;
    if (!(scale > 0) || !std::isfinite(scale)) scale = 1.0f;
    const auto zero_point = static_cast<uint8_t>(std::clamp(std::nearbyint(-low / scale), 0.0f, 255.0f));
    const std::string base = graph.UniqueName(absl::StrCat(input, "_uint8"));
    const onnx::TensorProto* scale_tensor = graph.AddInitializer(MakeFloatTensor(absl::StrCat(base, "_scale"), {}, {scale}));
    const onnx::TensorProto* zero_tensor = graph.AddInitializer(MakeRawTensor(
        absl::StrCat(base, "_zero_point"), onnx::TensorProto::UINT8, {}, std::string(1, static_cast<char>(zero_point))));
    const std::string quantized = graph.UniqueName(base);
    const std::string dequantized = graph.UniqueName(absl::StrCat(base, "_dequantized"));
    graph.AddNode(MakeNode("QuantizeLinear", graph.UniqueName(absl::StrCat(base, "_quantize")),
                           {input, scale_tensor->name(), zero_tensor->name()}, {quantized}),
                  anchor, /*after=*/false);
    graph.AddNode(MakeNode("DequantizeLinear", graph.UniqueName(absl::StrCat(base, "_dequantize")),
                           {quantized, scale_tensor->name(), zero_tensor->name()}, {dequantized}),
                  anchor, /*after=*/false);
    return dequantized;
  }

  static void EmitProduct(Graph& graph, PassContext& context, const std::string& activation, const FloatWeight& weight,
                          const Int8Weight& quantized, const std::string& output, const Node* anchor,
                          bool per_channel) {
    const int64_t k = weight.k, n = weight.n;
    const std::string base = graph.UniqueName(absl::StrCat(output, "_int8"));
    const std::vector<int64_t> scale_dims = per_channel ? std::vector<int64_t>{n} : std::vector<int64_t>{};
    const onnx::TensorProto* weight_tensor = graph.AddInitializer(
        MakeRawTensor(absl::StrCat(base, "_weight"), onnx::TensorProto::INT8, {k, n},
                      std::string(reinterpret_cast<const char*>(quantized.values.data()), quantized.values.size())));
    const onnx::TensorProto* scale_tensor =
        graph.AddInitializer(MakeFloatTensor(absl::StrCat(base, "_scale"), scale_dims, quantized.scales));
    const onnx::TensorProto* zero_tensor = graph.AddInitializer(
        MakeRawTensor(absl::StrCat(base, "_zero_point"), onnx::TensorProto::INT8, scale_dims,
                      std::string(quantized.scales.size(), '\0')));
    const std::string dequantized_weight = graph.UniqueName(absl::StrCat(base, "_dequantized"));
    onnx::NodeProto dequantize = MakeNode("DequantizeLinear", graph.UniqueName(absl::StrCat(base, "_dequantize")),
                                         {weight_tensor->name(), scale_tensor->name(), zero_tensor->name()},
                                         {dequantized_weight});
    if (per_channel) *dequantize.add_attribute() = MakeIntAttribute("axis", 1);
    graph.AddNode(std::move(dequantize), anchor, /*after=*/false);
    graph.AddNode(MakeNode("MatMul", base, {activation, dequantized_weight}, {output}), anchor, /*after=*/false);
    context.Count("weight_bytes_after",
                  static_cast<int64_t>(quantized.values.size() + quantized.scales.size() * (sizeof(float) + 1)));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeQuantizeStaticInt8Pass() { return std::make_unique<QuantizeStaticInt8Pass>(); }

}  // namespace onnxopt
