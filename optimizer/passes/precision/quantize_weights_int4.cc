// quantize_weights_int4: weight-only int4 for float products (decoders' memory-bound MatMuls), as
// ONNX Runtime's MatMulNBits.
//
// Before:  y = MatMul(x, W:f32[K,N])          (or Gemm, or Attention's packed Q|K|V weights)
// After:   y = MatMulNBits(x, B:uint8[N, K/bs, bs/2], scales:f32[N*K/bs] [, zero_points]) {bits=4, block_size=bs}
//
// Blocks of `block_size` weights along K (K zero-padded to a multiple) share a scale. Symmetric (the
// default, ONNX Runtime's quantizer's form): scale = -m/8 for m the block's value of largest
// magnitude, q = clamp(round(w/scale) + 8, 0, 15), no zero points (the operator's default is 8).
// Asymmetric: the block's range widened to include 0, scale = (max-min)/15, zero point
// round(-min/scale), packed two per byte like the weights (even element in the low nibble).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/precision/weight_products.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

class QuantizeWeightsInt4Pass final : public ShapedPass {
 public:
  absl::string_view name() const override { return "quantize_weights_int4"; }
  absl::string_view description() const override {
    return "Quantize the constant weights of MatMul, Gemm and Attention to 4 bits in blocks along K "
           "(ONNX Runtime's MatMulNBits); activations stay float";
  }
  std::vector<ParamSpec> params() const override {
    std::vector<ParamSpec> specs = {
        {"block_size", ParamType::kInt, "32", "weights per scale along K: 16, 32, 64, 128 or 256"},
        {"symmetric", ParamType::kBool, "true", "no zero points (else one per block)"},
        {"accuracy_level", ParamType::kInt, "4",
         "MatMulNBits accuracy_level: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations (default: the fastest on "
         "the CPU, where a decoder's decode step runs about twice as fast as with fp32 compute)"}};
    for (ParamSpec& spec : WeightProductParams()) specs.push_back(std::move(spec));
    return specs;
  }
  absl::Status ValidateParams(const PassParams& params) const override {
    const int64_t block = params.GetInt("block_size");
    if (block < 16 || block > 256 || (block & (block - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("block_size: ", block, " is not 16, 32, 64, 128 or 256"));
    }
    const int64_t level = params.GetInt("accuracy_level");
    if (level < 0 || level > 4) return absl::InvalidArgumentError("accuracy_level: must be 0..4");
    return absl::OkStatus();
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    const WeightProductOptions options = WeightProductOptionsFrom(context.params());
    const int64_t block = context.params().GetInt("block_size");
    const bool symmetric = context.params().GetBool("symmetric");
    const int64_t level = context.params().GetInt("accuracy_level");
    QuantizeWeightProducts(graph, context, shapes, options,
                           [&](Graph& g, PassContext& ctx, const std::string& input, const FloatWeight& weight,
                               const std::string& output, const Node* anchor) {
                             return Emit(g, ctx, input, weight, output, anchor, block, symmetric, level);
                           });
    return absl::OkStatus();
  }

 private:
  static bool Emit(Graph& graph, PassContext& context, const std::string& input, const FloatWeight& weight,
                   const std::string& output, const Node* anchor, int64_t block, bool symmetric, int64_t level) {
    const int64_t k = weight.k, n = weight.n;
    const int64_t blocks = (k + block - 1) / block;
    const int64_t blob = block / 2;
    std::string packed(static_cast<size_t>(n * blocks * blob), '\0');
    std::vector<float> scales(static_cast<size_t>(n * blocks));
    const int64_t zero_point_bytes = (blocks + 1) / 2;
    std::string zero_points(symmetric ? 0 : static_cast<size_t>(n * zero_point_bytes), '\0');
    for (int64_t col = 0; col < n; ++col) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t begin = b * block, end = std::min(k, begin + block);
        float scale = 1.0f;
        int zero_point = 8;
        float largest = 0.0f, low = 0.0f, high = 0.0f;
        for (int64_t row = begin; row < end; ++row) {
          const float w = weight.values[row * n + col];
          if (!std::isfinite(w)) {
            context.Skip("left in float: weight has NaN or Inf");
            return false;
          }
          if (std::fabs(w) > std::fabs(largest)) largest = w;
          low = std::min(low, w);
          high = std::max(high, w);
        }
        if (symmetric) {
          if (largest != 0.0f) scale = -largest / 8.0f;
        } else if (high > low) {
          scale = (high - low) / 15.0f;
          zero_point = static_cast<int>(std::clamp(std::nearbyint(-low / scale), 0.0f, 15.0f));
        }
        scales[col * blocks + b] = scale;
        if (!symmetric) {
          uint8_t& byte = reinterpret_cast<uint8_t&>(zero_points[col * zero_point_bytes + b / 2]);
          byte |= static_cast<uint8_t>(zero_point << ((b % 2) * 4));
        }
        for (int64_t row = begin; row < begin + block; ++row) {
          // Padding rows (beyond K) hold the zero point: they dequantize to 0.
          const float w = row < end ? weight.values[row * n + col] : 0.0f;
          const int q = static_cast<int>(std::clamp(std::nearbyint(w / scale) + zero_point, 0.0f, 15.0f));
          const int64_t index = row - begin;
          uint8_t& byte = reinterpret_cast<uint8_t&>(packed[(col * blocks + b) * blob + index / 2]);
          byte |= static_cast<uint8_t>(q << ((index % 2) * 4));
        }
      }
    }
    const std::string base = graph.UniqueName(absl::StrCat(output, "_int4"));
    onnx::TensorProto packed_tensor =
        MakeRawTensor(absl::StrCat(base, "_weight"), onnx::TensorProto::UINT8, {n, blocks, blob}, std::move(packed));
    onnx::TensorProto scale_tensor = MakeFloatTensor(absl::StrCat(base, "_scales"), {n * blocks}, scales);
    int64_t bytes_after = packed_tensor.raw_data().size() + scale_tensor.raw_data().size();
    onnx::NodeProto node =
        MakeNode("MatMulNBits", base, {input, packed_tensor.name(), scale_tensor.name()}, {output}, "com.microsoft");
    graph.AddInitializer(std::move(packed_tensor));
    graph.AddInitializer(std::move(scale_tensor));
    if (!symmetric) {
      onnx::TensorProto zero_tensor = MakeRawTensor(absl::StrCat(base, "_zero_points"), onnx::TensorProto::UINT8,
                                                {n * zero_point_bytes}, std::move(zero_points));
      bytes_after += zero_tensor.raw_data().size();
      node.add_input(zero_tensor.name());
      graph.AddInitializer(std::move(zero_tensor));
    }
    *node.add_attribute() = MakeIntAttribute("K", k);
    *node.add_attribute() = MakeIntAttribute("N", n);
    *node.add_attribute() = MakeIntAttribute("bits", 4);
    *node.add_attribute() = MakeIntAttribute("block_size", block);
    if (level > 0) *node.add_attribute() = MakeIntAttribute("accuracy_level", level);
    context.Count("weight_bytes_after", bytes_after);
    graph.AddNode(std::move(node), anchor, /*after=*/false);
    context.RequireOpset("com.microsoft", 1);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeQuantizeWeightsInt4Pass() { return std::make_unique<QuantizeWeightsInt4Pass>(); }

}  // namespace onnxopt
