// quantize_weights_int4: weight-only int4 for float products (decoders' memory-bound MatMuls), as
// ONNX Runtime's MatMulNBits.
//
// Before:  y = MatMul(x, W:f32[K,N])          (or Gemm, or Attention's packed Q|K|V weights)
// After:   y = MatMulNBits(x, B:uint8[N, K/bs, bs/2], scales:f32[N*K/bs] [, zero_points]) {bits=4, block_size=bs}
//
// Blocks of `block_size` weights along K share a scale (and, asymmetric, a zero point), chosen by
// `method`: round to nearest, or HQQ's error-minimizing solver (weight_blocks.h). The output
// projection (the product a graph output reads through reshapes, casts, bias or soft-capping: a
// decoder's lm_head, which decides every token) can instead keep 8-bit blocks (bits=8, as ONNX
// Runtime GenAI's `int4_nodes_to_exclude`/`last_matmul:int8` choices) or stay float.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/passes.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/precision/weight_blocks.h"
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
         "the CPU, where a decoder's decode step runs about twice as fast as with fp32 compute)"},
        {"method", ParamType::kString, "rtn", "rtn (round to nearest) or hqq (half-quadratic: asymmetric only)"},
        {"lm_head", ParamType::kString, "int4",
         "the output projection: int4 like the others, int8 (8-bit blocks) or float (left as it is)"}};
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
    const std::string& method = params.GetString("method");
    if (method != "rtn" && method != "hqq") return absl::InvalidArgumentError("method: must be rtn or hqq");
    if (method == "hqq" && params.GetBool("symmetric")) {
      return absl::InvalidArgumentError("method hqq solves zero points: it needs symmetric=false");
    }
    const std::string& lm_head = params.GetString("lm_head");
    if (lm_head != "int4" && lm_head != "int8" && lm_head != "float") {
      return absl::InvalidArgumentError("lm_head: must be int4, int8 or float");
    }
    return absl::OkStatus();
  }

  absl::Status RunWithShapes(Graph& graph, PassContext& context, const ShapeInfo& shapes) const override {
    WeightProductOptions options = WeightProductOptionsFrom(context.params());
    BlockQuantization how;
    how.block = context.params().GetInt("block_size");
    how.symmetric = context.params().GetBool("symmetric");
    how.method = context.params().GetString("method") == "hqq" ? BlockMethod::kHalfQuadratic
                                                                : BlockMethod::kRoundToNearest;
    const int64_t level = context.params().GetInt("accuracy_level");
    const std::string& lm_head = context.params().GetString("lm_head");
    const std::set<std::string> output_projections = OutputProjections(graph);
    if (lm_head == "float") {
      for (const auto& key : output_projections) {
        if (options.node_block_list.insert(key).second) context.Count("output_projections_kept_float");
      }
    }
    QuantizeWeightProducts(graph, context, shapes, options,
                           [&](Graph& g, PassContext& ctx, const std::string& input, const FloatWeight& weight,
                               const std::string& output, const Node* anchor) {
                             BlockQuantization node_how = how;
                             if (lm_head == "int8" && anchor != nullptr &&
                                 output_projections.count(NodeKey(*anchor)) > 0) {
                               node_how.bits = 8;
                               ctx.Count("output_projections_int8");
                             }
                             return Emit(g, ctx, input, weight, output, anchor, node_how, level);
                           });
    return absl::OkStatus();
  }

 private:
  // Products with a constant weight whose result a graph output reads through value-preserving steps
  // (reshapes, casts, a constant bias or scale, tanh soft-capping), by NodeKey.
  static std::set<std::string> OutputProjections(const Graph& graph) {
    static const std::set<std::string> kThrough = {"Reshape", "Transpose", "Cast",  "Identity", "Squeeze",
                                                   "Unsqueeze", "Flatten", "Add",  "Mul",      "Div", "Tanh"};
    std::set<std::string> keys;
    for (const auto& output : graph.proto().output()) {
      std::string value = output.name();
      for (int steps = 0; steps < 16; ++steps) {
        const Node* producer = graph.Producer(value);
        if (producer == nullptr) break;
        const std::string op(producer->op_type());
        if ((op == "MatMul" || op == "Gemm") && producer->input_size() > 1 &&
            ConstantTensor(graph, producer->input(1)) != nullptr) {
          keys.insert(NodeKey(*producer));
          break;
        }
        if (kThrough.count(op) == 0 || producer->input_size() == 0) break;
        // Binary steps: follow the one computed input, the other must be a constant.
        std::string next = producer->input(0);
        if (producer->input_size() > 1 && (op == "Add" || op == "Mul" || op == "Div")) {
          const bool first_constant = ConstantTensor(graph, producer->input(0)) != nullptr;
          const bool second_constant = ConstantTensor(graph, producer->input(1)) != nullptr;
          if (first_constant == second_constant || (first_constant && op == "Div")) break;
          next = first_constant ? producer->input(1) : producer->input(0);
        }
        value = next;
      }
    }
    return keys;
  }

  static bool Emit(Graph& graph, PassContext& context, const std::string& input, const FloatWeight& weight,
                   const std::string& output, const Node* anchor, const BlockQuantization& how, int64_t level) {
    std::optional<BlockQuantized> quantized = QuantizeBlocks(weight, how);
    if (!quantized) {
      context.Skip("left in float: weight has NaN or Inf");
      return false;
    }
    const int64_t k = weight.k, n = weight.n;
    const std::string base = graph.UniqueName(absl::StrCat(output, how.bits == 4 ? "_int4" : "_int8"));
    onnx::TensorProto packed_tensor =
        MakeRawTensor(absl::StrCat(base, "_weight"), onnx::TensorProto::UINT8,
                      {n, quantized->blocks, how.block * how.bits / 8}, std::move(quantized->packed));
    onnx::TensorProto scale_tensor = MakeFloatTensor(absl::StrCat(base, "_scales"), {n * quantized->blocks},
                                                     quantized->scales);
    int64_t bytes_after = packed_tensor.raw_data().size() + scale_tensor.raw_data().size();
    onnx::NodeProto node =
        MakeNode("MatMulNBits", base, {input, packed_tensor.name(), scale_tensor.name()}, {output}, "com.microsoft");
    graph.AddInitializer(std::move(packed_tensor));
    graph.AddInitializer(std::move(scale_tensor));
    if (!how.symmetric) {
      onnx::TensorProto zero_tensor =
          MakeRawTensor(absl::StrCat(base, "_zero_points"), onnx::TensorProto::UINT8,
                        {n * quantized->zero_point_bytes}, std::move(quantized->zero_points));
      bytes_after += zero_tensor.raw_data().size();
      node.add_input(zero_tensor.name());
      graph.AddInitializer(std::move(zero_tensor));
    }
    *node.add_attribute() = MakeIntAttribute("K", k);
    *node.add_attribute() = MakeIntAttribute("N", n);
    *node.add_attribute() = MakeIntAttribute("bits", how.bits);
    *node.add_attribute() = MakeIntAttribute("block_size", how.block);
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
