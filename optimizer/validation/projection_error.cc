#include "optimizer/validation/projection_error.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "optimizer/graph.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/precision/precision_common.h"

namespace onnxopt {
namespace {

// A MatMulNBits and the float product it replaced.
struct Replaced {
  const onnx::NodeProto* quantized = nullptr;
  std::string node;                            // the float product's NodeKey
  std::string input;                           // its activation
  const onnx::TensorProto* weight = nullptr;   // its float32 weight
  bool transposed = false;                     // Gemm's transB
};

std::map<std::string, const onnx::TensorProto*> Initializers(const onnx::GraphProto& graph) {
  std::map<std::string, const onnx::TensorProto*> tensors;
  for (const auto& tensor : graph.initializer()) tensors[tensor.name()] = &tensor;
  return tensors;
}

// MatMulNBits(x, ...) -> y where the float32 model computes y = MatMul(x, W), or y' = Gemm(x, W, b)
// and the quantized model y' = Add(y, b).
std::vector<Replaced> MatchReplaced(const onnx::GraphProto& fp32, const onnx::GraphProto& quantized) {
  std::map<std::string, const onnx::NodeProto*> producers;
  for (const auto& node : fp32.node()) {
    for (const auto& output : node.output()) producers[output] = &node;
  }
  std::map<std::string, std::vector<const onnx::NodeProto*>> readers;
  for (const auto& node : quantized.node()) {
    for (const auto& input : node.input()) readers[input].push_back(&node);
  }
  const auto weights = Initializers(fp32);
  std::vector<Replaced> replaced;
  for (const auto& node : quantized.node()) {
    if (node.op_type() != "MatMulNBits" || node.output_size() == 0 || node.input_size() < 3) continue;
    const onnx::NodeProto* product = nullptr;
    if (auto it = producers.find(node.output(0)); it != producers.end() && it->second->op_type() == "MatMul") {
      product = it->second;
    } else if (auto bias = readers.find(node.output(0)); bias != readers.end() && bias->second.size() == 1 &&
                                                          bias->second[0]->op_type() == "Add") {
      auto gemm = producers.find(bias->second[0]->output(0));
      if (gemm != producers.end() && gemm->second->op_type() == "Gemm") product = gemm->second;
    }
    if (product == nullptr || product->input_size() < 2 || product->input(0) != node.input(0)) continue;
    auto weight = weights.find(product->input(1));
    if (weight == weights.end()) continue;
    replaced.push_back({&node, NodeKey(*product), product->input(0), weight->second,
                        product->op_type() == "Gemm" && GetAttributeInt(*product, "transB", 0) != 0});
  }
  return replaced;
}

// The weight a MatMulNBits stands for, [k, n]; nullopt when its tensors are not readable here.
std::optional<std::vector<float>> Dequantized(const onnx::NodeProto& node,
                                              const std::map<std::string, const onnx::TensorProto*>& tensors,
                                              BlockQuantization* how) {
  const int64_t k = GetAttributeInt(node, "K", 0), n = GetAttributeInt(node, "N", 0);
  how->bits = static_cast<int>(GetAttributeInt(node, "bits", 4));
  how->block = GetAttributeInt(node, "block_size", 0);
  if (k <= 0 || n <= 0 || how->block <= 0 || (how->bits != 4 && how->bits != 8)) return std::nullopt;
  auto tensor = [&](int i) -> const onnx::TensorProto* {
    if (i >= node.input_size() || node.input(i).empty()) return nullptr;
    auto it = tensors.find(node.input(i));
    return it == tensors.end() ? nullptr : it->second;
  };
  for (int i = 4; i < node.input_size(); ++i) {
    if (!node.input(i).empty()) return std::nullopt;  // g_idx or bias: not what the pass writes
  }
  const onnx::TensorProto* packed = tensor(1);
  const onnx::TensorProto* scales = tensor(2);
  const onnx::TensorProto* zero_points = tensor(3);
  if (packed == nullptr || scales == nullptr) return std::nullopt;
  how->symmetric = zero_points == nullptr;
  if (zero_points != nullptr && zero_points->data_type() != onnx::TensorProto::UINT8) return std::nullopt;
  BlockQuantized blocks;
  blocks.blocks = (k + how->block - 1) / how->block;
  blocks.zero_point_bytes = (blocks.blocks * how->bits + 7) / 8;
  std::string scratch;
  const std::string* raw = RawBytes(*packed, &scratch);
  if (raw == nullptr || static_cast<int64_t>(raw->size()) != n * blocks.blocks * how->block * how->bits / 8) {
    return std::nullopt;
  }
  blocks.packed = *raw;
  std::optional<std::vector<float>> scale_values = TensorFloats(*scales);
  if (!scale_values || static_cast<int64_t>(scale_values->size()) != n * blocks.blocks) return std::nullopt;
  blocks.scales = *std::move(scale_values);
  if (zero_points != nullptr) {
    const std::string* zero_raw = RawBytes(*zero_points, &scratch);
    if (zero_raw == nullptr || static_cast<int64_t>(zero_raw->size()) != n * blocks.zero_point_bytes) return std::nullopt;
    blocks.zero_points = *zero_raw;
  }
  return DequantizeBlocks(blocks, k, n, *how);
}

// ||approx - W|| / ||W||, leaving approx - W in `approx`.
double WeightErrorToDelta(const std::vector<float>& weight, std::vector<float>* approx) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < weight.size(); ++i) {
    (*approx)[i] -= weight[i];
    error += static_cast<double>((*approx)[i]) * (*approx)[i];
    norm += static_cast<double>(weight[i]) * weight[i];
  }
  return norm > 0 ? std::sqrt(error / norm) : 0.0;
}

// Sum over rows of ||x M||^2 for M [k, n].
double SquaredProductNorm(const ActivationRows& x, const std::vector<float>& m, int64_t n) {
  std::vector<float> row(static_cast<size_t>(n));
  double total = 0;
  for (int64_t r = 0; r < x.rows; ++r) {
    std::fill(row.begin(), row.end(), 0.0f);
    const float* xs = x.values.data() + r * x.k;
    for (int64_t i = 0; i < x.k; ++i) {
      const float v = xs[i];
      if (v == 0.0f) continue;
      const float* line = m.data() + i * n;
      for (int64_t j = 0; j < n; ++j) row[j] += v * line[j];
    }
    for (float value : row) total += static_cast<double>(value) * value;
  }
  return total;
}

}  // namespace

ActivationRows ProjectionRows(const std::vector<int64_t>& shape, const float* data) {
  ActivationRows rows;
  if (shape.empty() || shape.back() <= 0) return rows;
  rows.k = shape.back();
  int64_t total = 1;
  for (int64_t dim : shape) total *= dim;
  const int64_t available = total / rows.k;
  rows.rows = std::min<int64_t>(available, kProjectionRows);
  rows.values.resize(static_cast<size_t>(rows.rows * rows.k));
  for (int64_t r = 0; r < rows.rows; ++r) {
    const int64_t source = rows.rows > 1 ? r * (available - 1) / (rows.rows - 1) : 0;
    std::copy(data + source * rows.k, data + (source + 1) * rows.k, rows.values.begin() + r * rows.k);
  }
  return rows;
}

void DescribeProjectionErrors(const onnx::ModelProto& fp32_model, const onnx::ModelProto& quantized,
                              BlockMethod method, const CaptureActivations& capture, v1::PrecisionReport* report) {
  report->set_method(BlockMethodName(method));
  const std::vector<Replaced> replaced = MatchReplaced(fp32_model.graph(), quantized.graph());
  if (replaced.empty()) return;
  std::map<std::string, ActivationRows> activations;
  if (capture == nullptr) {
    report->set_projections_note("output errors not measured: no activations were captured");
  } else {
    std::set<std::string> unique;
    for (const auto& product : replaced) unique.insert(product.input);
    absl::Status captured = capture(std::vector<std::string>(unique.begin(), unique.end()), &activations);
    if (!captured.ok()) {
      activations.clear();
      report->set_projections_note(absl::StrCat("output errors not measured: ", captured.message()));
    }
  }
  const auto tensors = Initializers(quantized.graph());
  std::vector<v1::ProjectionError> errors;
  int measured = 0;
  for (const auto& product : replaced) {
    BlockQuantization how;
    std::optional<std::vector<float>> approx = Dequantized(*product.quantized, tensors, &how);
    if (!approx) continue;
    std::optional<FloatWeight> weight = ReadProductWeight(*product.weight, product.transposed);
    if (!weight || weight->values.size() != approx->size()) continue;
    v1::ProjectionError error;
    error.set_node(product.node);
    error.set_k(weight->k);
    error.set_n(weight->n);
    error.set_bits(how.bits);
    error.set_weight_error(WeightErrorToDelta(weight->values, &*approx));
    // Round-to-nearest of the same weight, bits and blocks, as the reference a method is judged against.
    std::vector<float> rtn_delta;
    if (method == BlockMethod::kRoundToNearest) {
      error.set_rtn_weight_error(error.weight_error());
    } else {
      BlockQuantization rtn = how;
      rtn.method = BlockMethod::kRoundToNearest;
      if (std::optional<BlockQuantized> blocks = QuantizeBlocks(*weight, rtn)) {
        rtn_delta = DequantizeBlocks(*blocks, weight->k, weight->n, rtn);
        error.set_rtn_weight_error(WeightErrorToDelta(weight->values, &rtn_delta));
      }
    }
    auto rows = activations.find(product.input);
    if (rows != activations.end() && rows->second.k == weight->k && rows->second.rows > 0) {
      const double output_norm = SquaredProductNorm(rows->second, weight->values, weight->n);
      auto relative = [&](const std::vector<float>& delta) {
        return output_norm > 0 ? std::sqrt(SquaredProductNorm(rows->second, delta, weight->n) / output_norm) : 0.0;
      };
      error.set_output_error(relative(*approx));
      error.set_rtn_output_error(rtn_delta.empty() ? error.output_error() : relative(rtn_delta));
      ++measured;
    } else {
      error.set_output_error(-1);
      error.set_rtn_output_error(-1);
    }
    errors.push_back(std::move(error));
  }
  if (errors.empty()) return;
  SetProjectionMeans(errors, report);
  if (measured > 0 && measured < static_cast<int>(errors.size()) && report->projections_note().empty()) {
    report->set_projections_note(
        absl::StrCat("output errors measured on ", measured, " of ", errors.size(), " products (the others' inputs "
                     "were not captured as float32 [..., K] tensors)"));
  }
  std::stable_sort(errors.begin(), errors.end(), [](const v1::ProjectionError& a, const v1::ProjectionError& b) {
    return a.output_error() != b.output_error() ? a.output_error() > b.output_error()
                                                : a.weight_error() > b.weight_error();
  });
  if (errors.size() > static_cast<size_t>(kMaxProjectionsReported)) errors.resize(kMaxProjectionsReported);
  for (auto& error : errors) *report->add_projections() = std::move(error);
}

}  // namespace onnxopt
