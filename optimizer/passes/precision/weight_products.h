// The float products with constant weights that weight quantization rewrites, whatever form the
// pipeline left them in: MatMul(x, W[K,N]), Gemm(x, W, c) without transA (transB transposes W), and
// com.microsoft Attention with packed Q|K|V weights, which is split into one product, Split and
// MultiHeadAttention so its weights can be quantized too (the int8 and int4 forms ONNX Runtime has
// for Attention itself are narrower: per-tensor input scales, no attention_bias).
#ifndef ONNXOPT_OPTIMIZER_PASSES_PRECISION_WEIGHT_PRODUCTS_H_
#define ONNXOPT_OPTIMIZER_PASSES_PRECISION_WEIGHT_PRODUCTS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "optimizer/graph.h"
#include "optimizer/pass.h"

namespace onnxopt {

// W, row-major [k, n].
struct FloatWeight {
  std::vector<float> values;
  int64_t k = 0;
  int64_t n = 0;
};

// The constant float32 weight `value` as [k, n] (transposed from [n, k] when `transposed`, as Gemm's
// transB has it); nullopt for an activation, a weight of another type or rank.
std::optional<FloatWeight> ReadProductWeight(const Graph& graph, const std::string& value, bool transposed);
std::optional<FloatWeight> ReadProductWeight(const onnx::TensorProto& tensor, bool transposed);

// Emits nodes computing `output` = `input` · W (before `anchor`) and returns false, leaving the graph
// untouched, when it declines (with context.Skip saying why).
using EmitWeightProduct = std::function<bool(Graph& graph, PassContext& context, const std::string& input,
                                             const FloatWeight& weight, const std::string& output,
                                             const Node* anchor)>;

struct WeightProductOptions {
  std::set<std::string> op_types;         // of MatMul, Gemm, Attention: which forms to rewrite
  std::set<std::string> node_block_list;  // names (or first outputs) left alone
  int64_t min_elements = 1;               // smaller weights stay float
};

// The parameters every weight quantizer takes (op_types, node_block_list, min_elements), and the
// options they give.
std::vector<ParamSpec> WeightProductParams();
WeightProductOptions WeightProductOptionsFrom(const PassParams& params);

// Rewrites every product the options allow with `emit`; counts "quantized_weights" and
// "weight_bytes_before" (float32 bytes of the weights replaced).
void QuantizeWeightProducts(Graph& graph, PassContext& context, const ShapeInfo& shapes,
                            const WeightProductOptions& options, const EmitWeightProduct& emit);

// W quantized symmetrically to int8 (zero point 0, range ±levels: 127, or 63 for 7-bit weights): one
// scale per output column (per_channel) or one for all, scale = max|W| / levels, q = round(W / scale).
// nullopt for NaN or Inf.
struct Int8Weight {
  std::vector<int8_t> values;  // [k, n]
  std::vector<float> scales;   // [n] or [1]
};
std::optional<Int8Weight> QuantizeSymmetricInt8(const FloatWeight& weight, bool per_channel, int levels = 127);

// Whether this CPU multiplies uint8 by int8 with 32-bit sums (x86's AVX-512 VNNI or AVX-VNNI; every
// non-x86 CPU ONNX Runtime targets). Without them, x86's u8s8 kernels (AVX2's vpmaddubsw) add pairs of
// products in 16 bits, which saturates for full-range weights: 2 x 255 x 127 > 32767.
bool CpuHasInt8DotProducts();

// The activations (first inputs) of the products QuantizeWeightProducts may rewrite: what static
// quantization calibrates. A superset where a rewrite later declines.
std::set<std::string> WeightProductInputs(const Graph& graph, const std::set<std::string>& op_types);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_PRECISION_WEIGHT_PRODUCTS_H_
