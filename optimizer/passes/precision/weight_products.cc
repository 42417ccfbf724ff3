#include "optimizer/passes/precision/weight_products.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/passes/rewrite.h"

namespace onnxopt {
namespace {

bool RewriteMatMulOrGemm(Graph& graph, PassContext& context, Node* node, const WeightProductOptions& options,
                         const EmitWeightProduct& emit) {
  const bool gemm = node->op_type() == "Gemm";
  std::string bias;
  if (gemm) {
    if (node->GetAttributeInt("transA", 0) != 0 || node->GetAttributeFloat("alpha", 1.0f) != 1.0f) return false;
    if (node->input_size() > 2 && !node->input(2).empty()) {
      if (node->GetAttributeFloat("beta", 1.0f) != 1.0f) return false;
      bias = node->input(2);
    }
  }
  std::optional<FloatWeight> weight = ReadProductWeight(graph, node->input(1), gemm && node->GetAttributeInt("transB", 0) != 0);
  if (!weight) return false;  // an activation product, or a weight of another type
  if (static_cast<int64_t>(weight->values.size()) < options.min_elements) {
    context.Skip("left in float: weight smaller than min_elements");
    return false;
  }
  const std::string output = node->output(0);
  const std::string product = bias.empty() ? output : graph.UniqueName(absl::StrCat(output, "_product"));
  if (!emit(graph, context, node->input(0), *weight, product, node)) return false;
  if (!bias.empty()) {
    graph.AddNode(MakeNode("Add", graph.UniqueName(absl::StrCat(NodeKey(*node), "_bias")), {product, bias}, {output}),
                  node, /*after=*/false);
  }
  context.Count("weight_bytes_before", static_cast<int64_t>(weight->values.size() * sizeof(float)));
  graph.RemoveNode(node);
  return true;
}

// Attention(x, W[D,3H], b, mask, "", attention_bias) ->
//   MultiHeadAttention(Split(x · W), bias = b, key_padding_mask = mask, attention_bias)
bool RewriteAttention(Graph& graph, PassContext& context, const ShapeInfo& shapes, Node* node,
                      const WeightProductOptions& options,
                      const EmitWeightProduct& emit) {
  for (const char* unsupported : {"qkv_hidden_sizes", "do_rotary", "past_present_share_buffer"}) {
    if (node->FindAttribute(unsupported) != nullptr) {
      context.Skip(absl::StrCat("Attention left in float: it has ", unsupported));
      return false;
    }
  }
  auto input = [&](int i) -> std::string { return i < node->input_size() ? node->input(i) : std::string(); };
  if (node->input_size() > 6 || !input(4).empty() || input(2).empty() ||
      (node->output_size() > 1 && !node->output(1).empty() && graph.HasConsumers(node->output(1)))) {
    context.Skip("Attention left in float: past/present state or extra inputs");
    return false;
  }
  const std::string mask = input(3);
  if (!mask.empty()) {
    std::optional<int> rank = shapes.Rank(mask);
    if (!rank || *rank > 2) {
      context.Skip("Attention left in float: its mask is not known to be 1-D or 2-D (MultiHeadAttention's forms)");
      return false;
    }
  }
  std::optional<FloatWeight> weight = ReadProductWeight(graph, input(1), false);
  if (!weight || weight->n % 3 != 0) return false;
  if (static_cast<int64_t>(weight->values.size()) < options.min_elements) {
    context.Skip("left in float: weight smaller than min_elements");
    return false;
  }
  const std::string base = NodeKey(*node);
  const std::string qkv = graph.UniqueName(absl::StrCat(base, "_qkv"));
  if (!emit(graph, context, input(0), *weight, qkv, node)) return false;
  const int64_t hidden = weight->n / 3;
  std::vector<std::string> parts;
  for (const char* part : {"_q", "_k", "_v"}) parts.push_back(graph.UniqueName(absl::StrCat(base, part)));
  onnx::NodeProto split = MakeNode("Split", graph.UniqueName(absl::StrCat(base, "_split")), {qkv}, parts);
  *split.add_attribute() = MakeIntAttribute("axis", -1);
  if (context.OpsetVersion("") >= 13) {
    onnx::TensorProto sizes = MakeInt64Tensor(graph.UniqueName(absl::StrCat(base, "_split_sizes")), {hidden, hidden, hidden});
    split.add_input(sizes.name());
    graph.AddInitializer(std::move(sizes));
  } else {
    *split.add_attribute() = MakeIntsAttribute("split", {hidden, hidden, hidden});
  }
  graph.AddNode(std::move(split), node, /*after=*/false);
  std::vector<std::string> mha_inputs = {parts[0], parts[1], parts[2], input(2), mask};
  if (!input(5).empty()) mha_inputs.push_back(input(5));
  onnx::NodeProto mha = MakeNode("MultiHeadAttention", graph.UniqueName(absl::StrCat(base, "_mha")), mha_inputs,
                                 {node->output(0)}, "com.microsoft");
  for (const auto& attribute : node->proto().attribute()) {
    if (attribute.name() == "num_heads" || attribute.name() == "unidirectional" || attribute.name() == "scale" ||
        attribute.name() == "mask_filter_value") {
      *mha.add_attribute() = attribute;
    }
  }
  graph.AddNode(std::move(mha), node, /*after=*/false);
  context.RequireOpset("com.microsoft", 1);
  context.Count("weight_bytes_before", static_cast<int64_t>(weight->values.size() * sizeof(float)));
  context.Count("attention_unpacked");
  graph.RemoveNode(node);
  return true;
}

// MatMul or Gemm (ONNX) or com.microsoft Attention, and among the forms asked for.
bool IsProductForm(const Node& node, const std::set<std::string>& op_types) {
  const std::string op(node.op_type());
  const bool known = node.domain().empty() ? (op == "MatMul" || op == "Gemm")
                                           : (op == "Attention" && node.domain() == "com.microsoft");
  return known && op_types.count(op) > 0;
}

}  // namespace

std::optional<FloatWeight> ReadProductWeight(const onnx::TensorProto& tensor, bool transposed) {
  if (tensor.dims_size() != 2) return std::nullopt;
  std::optional<std::vector<float>> values = TensorFloats(tensor);
  if (!values) return std::nullopt;
  FloatWeight weight;
  weight.k = tensor.dims(transposed ? 1 : 0);
  weight.n = tensor.dims(transposed ? 0 : 1);
  if (weight.k * weight.n != static_cast<int64_t>(values->size())) return std::nullopt;
  if (!transposed) {
    weight.values = *std::move(values);
  } else {
    weight.values.resize(values->size());
    for (int64_t row = 0; row < weight.n; ++row) {
      for (int64_t col = 0; col < weight.k; ++col) weight.values[col * weight.n + row] = (*values)[row * weight.k + col];
    }
  }
  return weight;
}

std::optional<FloatWeight> ReadProductWeight(const Graph& graph, const std::string& value, bool transposed) {
  const onnx::TensorProto* tensor = ConstantTensor(graph, value);
  if (tensor == nullptr) return std::nullopt;
  return ReadProductWeight(*tensor, transposed);
}

std::vector<ParamSpec> WeightProductParams() {
  return {{"op_types", ParamType::kString, "MatMul,Gemm,Attention", "comma-separated forms to quantize"},
          {"node_block_list", ParamType::kString, "", "comma-separated node names left in float"},
          {"min_elements", ParamType::kInt, "64", "weights with fewer elements stay float"}};
}

WeightProductOptions WeightProductOptionsFrom(const PassParams& params) {
  WeightProductOptions options;
  options.op_types = SplitNameList(params.GetString("op_types"));
  options.node_block_list = SplitNameList(params.GetString("node_block_list"));
  options.min_elements = params.GetInt("min_elements");
  return options;
}

std::optional<Int8Weight> QuantizeSymmetricInt8(const FloatWeight& weight, bool per_channel, int levels) {
  const int64_t k = weight.k, n = weight.n;
  Int8Weight quantized;
  quantized.scales.assign(per_channel ? n : 1, 0.0f);
  for (int64_t row = 0; row < k; ++row) {
    for (int64_t col = 0; col < n; ++col) {
      const float magnitude = std::fabs(weight.values[row * n + col]);
      if (!std::isfinite(magnitude)) return std::nullopt;
      float& scale = quantized.scales[per_channel ? col : 0];
      scale = std::max(scale, magnitude);
    }
  }
  const float top = static_cast<float>(levels);
  for (float& scale : quantized.scales) scale = scale > 0 ? scale / top : 1.0f;
  quantized.values.resize(weight.values.size());
  for (int64_t row = 0; row < k; ++row) {
    for (int64_t col = 0; col < n; ++col) {
      const float q = std::nearbyint(weight.values[row * n + col] / quantized.scales[per_channel ? col : 0]);
      quantized.values[row * n + col] = static_cast<int8_t>(std::clamp(q, -top, top));
    }
  }
  return quantized;
}

bool CpuHasInt8DotProducts() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avxvnni");
#else
  return true;
#endif
}

std::set<std::string> WeightProductInputs(const Graph& graph, const std::set<std::string>& op_types) {
  std::set<std::string> inputs;
  for (const Node* node : graph.Nodes()) {
    if (!IsProductForm(*node, op_types) || node->input_size() < 2) continue;
    const onnx::TensorProto* weight = ConstantTensor(graph, node->input(1));
    if (weight != nullptr && weight->dims_size() == 2 && weight->data_type() == onnx::TensorProto::FLOAT) {
      inputs.insert(node->input(0));
    }
  }
  return inputs;
}

void QuantizeWeightProducts(Graph& graph, PassContext& context, const ShapeInfo& shapes,
                            const WeightProductOptions& options, const EmitWeightProduct& emit) {
  for (Node* node : graph.Nodes()) {
    if (!IsProductForm(*node, options.op_types)) continue;
    const bool attention = node->op_type() == "Attention";
    if (options.node_block_list.count(NodeKey(*node)) > 0) {
      context.Skip("left in float: node block list");
      continue;
    }
    const bool rewritten = attention ? RewriteAttention(graph, context, shapes, node, options, emit)
                                     : RewriteMatMulOrGemm(graph, context, node, options, emit);
    if (rewritten) {
      context.CountRewrite();
      context.Count("quantized_weights");
    }
  }
}

}  // namespace onnxopt
