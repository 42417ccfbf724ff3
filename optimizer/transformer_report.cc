#include "optimizer/transformer_report.h"

#include <algorithm>
#include <bitset>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizer/graph.h"
#include "optimizer/graph_bodies.h"
#include "optimizer/model_io.h"
#include "optimizer/passes/constants.h"

namespace onnxopt {
namespace {

constexpr char kMicrosoft[] = "com.microsoft";

bool DefaultDomain(const onnx::NodeProto& node) { return node.domain().empty() || node.domain() == "ai.onnx"; }

// Keyed by views into the model, which outlives the maps: no copy of 100k names.
using ProducerMap = absl::flat_hash_map<absl::string_view, const onnx::NodeProto*>;
using InitializerMap = absl::flat_hash_map<absl::string_view, const onnx::TensorProto*>;
using ConsumerMap = absl::flat_hash_map<absl::string_view, std::vector<const onnx::NodeProto*>>;

// Producers of the main graph's values.
ProducerMap Producers(const onnx::GraphProto& graph) {
  ProducerMap producers;
  producers.reserve(static_cast<size_t>(graph.node_size()));
  for (const auto& node : graph.node()) {
    for (const auto& output : node.output()) producers[output] = &node;
  }
  return producers;
}

ConsumerMap Consumers(const onnx::GraphProto& graph) {
  ConsumerMap consumers;
  for (const auto& node : graph.node()) {
    for (const auto& input : node.input()) {
      if (!input.empty()) consumers[input].push_back(&node);
    }
  }
  return consumers;
}

InitializerMap Initializers(const onnx::GraphProto& graph) {
  InitializerMap initializers;
  initializers.reserve(static_cast<size_t>(graph.initializer_size()));
  for (const auto& tensor : graph.initializer()) initializers[tensor.name()] = &tensor;
  return initializers;
}

// True if `value` is a stored weight: an initializer or a Constant, maybe cast, transposed or
// dequantized on the way.
bool IsWeight(const ProducerMap& producers, const InitializerMap& initializers, const std::string& value,
              int depth = 3) {
  if (initializers.count(value) > 0) return true;
  auto it = producers.find(value);
  if (it == producers.end() || depth == 0) return false;
  const onnx::NodeProto& node = *it->second;
  if (node.op_type() == "Constant") return true;
  if (node.op_type() != "Cast" && node.op_type() != "Transpose" && node.op_type() != "DequantizeLinear") return false;
  return node.input_size() >= 1 && IsWeight(producers, initializers, node.input(0), depth - 1);
}

// The MatMul (or two-operand Einsum) of two activations (Q times K^T) found walking up from `value` through at most `depth`
// nodes (scale, masks and the views around them, causal Where), or null: with one, the Softmax is attention's. A MatMul with a
// weight is a classifier head's (a recognizer's per-position character scores).
const onnx::NodeProto* ScoresMatMul(const ProducerMap& producers, const InitializerMap& initializers,
                                    const std::string& value, int depth) {
  auto it = producers.find(value);
  if (it == producers.end() || depth < 0) return nullptr;
  const onnx::NodeProto& node = *it->second;
  if (node.op_type() == "MatMul" || node.op_type() == "Einsum") {  // Keras writes Q K^T as an Einsum
    const bool scores = node.input_size() == 2 && !IsWeight(producers, initializers, node.input(0)) &&
                        !IsWeight(producers, initializers, node.input(1));
    return scores ? &node : nullptr;
  }
  // A Reshape's or Expand's shape is no data (older CLIP's and BART's scores viewed as [B, N, S, T] to
  // add each mask, and back).
  const bool shaped = node.op_type() == "Reshape" || node.op_type() == "Expand";
  for (int i = 0; i < (shaped ? std::min(node.input_size(), 1) : node.input_size()); ++i) {
    if (const onnx::NodeProto* found = ScoresMatMul(producers, initializers, node.input(i), depth - 1)) return found;
  }
  return nullptr;
}

// Which graph inputs each value is computed from (initializers left out), as a bit per input by its
// position (from the 256th on they share the last bit), filled in one pass over the nodes in order (loading
// sorted them; a value read before it is written counts as from no input, which reads as self-attention).
// What a value's shape is computed from does not count.
class InputSources {
 public:
  using Bits = std::bitset<256>;
  InputSources(const onnx::GraphProto& graph, const InitializerMap& initializers) {
    size_t bit = 0;
    for (const auto& input : graph.input()) {
      if (initializers.count(input.name()) > 0) continue;
      sources_[input.name()].set(std::min(bit++, kLast));
    }
    for (const auto& node : graph.node()) {
      Bits read;
      // A shape is no data: older BART's K flattened by `view(batch * heads, -1, D)` reads Q's batch.
      const bool shape_only = node.op_type() == "Shape" || node.op_type() == "Size";
      for (const std::string& input : node.input()) read |= shape_only ? none_ : Of(input);
      for (const std::string& output : node.output()) {
        if (!output.empty()) sources_[output] = read;
      }
    }
  }
  const Bits& Of(const std::string& value) const {
    auto it = sources_.find(value);
    return it == sources_.end() ? none_ : it->second;
  }

 private:
  static constexpr size_t kLast = 255;
  absl::flat_hash_map<std::string, Bits> sources_;
  Bits none_;
};

// Cross-attention: Q is computed from a graph input its K^T is not (the decoder's ids, where K comes
// from an encoder's output or its keys as given). A self-attention's K reads all Q reads, a cache's past
// besides.
bool IsCrossAttention(const InputSources& sources, const onnx::NodeProto& scores) {
  const InputSources::Bits& q = sources.Of(scores.input(0));
  const InputSources::Bits& k = sources.Of(scores.input(1));
  return k.any() && (q & ~k).any();
}

// True if `value` is cut (Slice, Identity) out of a lower-triangular square constant [1,1,P,P]: the
// causal mask of a decoder.
bool IsCausalBuffer(const ProducerMap& producers, const InitializerMap& initializers, absl::string_view value) {
  for (int depth = 0; depth < 4; ++depth) {
    auto it = producers.find(value);
    if (it == producers.end()) break;
    if (it->second->op_type() != "Slice" && it->second->op_type() != "Identity") return false;
    value = it->second->input(0);
  }
  auto buffer = initializers.find(value);
  if (buffer == initializers.end()) return false;
  const onnx::TensorProto& tensor = *buffer->second;
  if (tensor.dims_size() != 4 || tensor.dims(2) != tensor.dims(3) || tensor.data_type() != onnx::TensorProto::BOOL) {
    return false;
  }
  std::string scratch;
  const std::string* bytes = RawBytes(tensor, &scratch);
  if (bytes == nullptr) return false;
  const int64_t n = tensor.dims(2);
  const std::string& raw = *bytes;
  if (static_cast<int64_t>(raw.size()) != n * n * tensor.dims(0) * tensor.dims(1)) return false;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if ((raw[static_cast<size_t>(i * n + j)] != 0) != (j <= i)) return false;
    }
  }
  return true;
}

}  // namespace

namespace {

// True if `value` is computed from a Range within a few steps (Unsqueeze, Add, Mul, Cast, Expand):
// a position index.
bool FromRange(const ProducerMap& producers, const std::string& value, int depth, const onnx::NodeProto** range) {
  auto it = producers.find(value);
  if (it == producers.end() || depth < 0) return false;
  const onnx::NodeProto& node = *it->second;
  if (node.op_type() == "Range") {
    *range = &node;
    return true;
  }
  static const std::set<std::string> kCarriers = {"Unsqueeze", "Add", "Sub", "Mul", "Cast", "Expand", "Reshape"};
  if (kCarriers.count(node.op_type()) == 0) return false;
  for (const auto& input : node.input()) {
    if (FromRange(producers, input, depth - 1, range)) return true;
  }
  return false;
}

// The tensor `value` holds when it is constant: an initializer or a Constant node's value.
const onnx::TensorProto* ConstantOf(const ProducerMap& producers, const InitializerMap& initializers,
                                    absl::string_view value) {
  if (auto it = initializers.find(value); it != initializers.end()) return it->second;
  auto it = producers.find(value);
  if (it == producers.end() || it->second->op_type() != "Constant") return nullptr;
  for (const auto& attribute : it->second->attribute()) {
    if (attribute.name() == "value" && attribute.has_t()) return &attribute.t();
  }
  return nullptr;
}

std::optional<float> ScalarOf(const ProducerMap& producers, const InitializerMap& initializers,
                              absl::string_view value) {
  const onnx::TensorProto* tensor = ConstantOf(producers, initializers, value);
  if (tensor == nullptr) return std::nullopt;
  if (std::optional<std::vector<float>> floats = TensorFloats(*tensor)) {
    if (floats->size() == 1) return (*floats)[0];
  } else if (std::optional<std::vector<int64_t>> ints = TensorInts(*tensor); ints && ints->size() == 1) {
    return static_cast<float>((*ints)[0]);
  }
  return std::nullopt;
}

// The producer of `value` past Casts, or nullptr.
const onnx::NodeProto* ProducerPastCasts(const ProducerMap& producers, absl::string_view value) {
  for (int depth = 0; depth < 4; ++depth) {
    auto it = producers.find(value);
    if (it == producers.end()) return nullptr;
    if (it->second->op_type() != "Cast") return it->second;
    value = it->second->input(0);
  }
  return nullptr;
}

// What tells the families of a kind apart, from one node (see DetectTransformer).
void ReadFamilyEvidence(const onnx::NodeProto& node, const ProducerMap& producers, const InitializerMap& initializers,
                        const ConsumerMap& consumers,
                        const std::set<std::string>& integer_inputs, TransformerEvidence* found) {
  const absl::string_view op = node.op_type();
  auto producer_op = [&](absl::string_view value) -> absl::string_view {
    auto it = producers.find(value);
    return it == producers.end() ? absl::string_view() : absl::string_view(it->second->op_type());
  };
  auto constant = [&](absl::string_view value) { return ConstantOf(producers, initializers, value); };
  auto readers = [&](absl::string_view value) -> const std::vector<const onnx::NodeProto*>& {
    static const std::vector<const onnx::NodeProto*> kNone;
    auto it = consumers.find(value);
    return it == consumers.end() ? kNone : it->second;
  };
  if (op == "Conv" && node.input_size() >= 2) {
    const onnx::TensorProto* weight = constant(node.input(1));
    found->audio_convolution |= weight != nullptr && weight->dims_size() == 3;
    const int64_t groups = GetAttributeInt(node, "group", 1);
    found->depthwise_convolution |= weight != nullptr && weight->dims_size() == 3 && groups > 1 &&
                                    weight->dims(0) == groups && weight->dims(1) == 1;
  } else if (op == "Concat" && node.input_size() == 3 && GetAttributeInt(node, "axis", 0) == 1) {
    // DeiT: cat(class token, distillation token, patches).
    found->distillation_token |= producer_op(node.input(0)) == "Expand" && producer_op(node.input(1)) == "Expand";
  } else if (op == "Gather" && node.input_size() == 2) {
    const onnx::TensorProto* table = constant(node.input(0));
    if (table != nullptr && table->dims_size() == 2) {
      if (integer_inputs.count(node.input(1)) > 0) found->vocabulary = std::max(found->vocabulary, table->dims(0));
      // A token-type table has a handful of rows (BERT 2, RoBERTa 1); position and word tables hundreds.
      found->token_types |= table->dims(0) >= 1 && table->dims(0) <= 16 && table->dims(1) > 16;
      found->embedding_lookups += table->dims(0) > 16 ? 1 : 0;
    }
  } else if (op == "EmbedLayerNormalization") {
    found->token_types |= node.input_size() > 4 && !node.input(4).empty();
    found->embedding_lookups += 2;  // already fused: word and position tables
  } else if (op == "Sigmoid" && node.input_size() == 1) {
    // x * sigmoid(1.702 x): the Gelu approximation CLIP uses.
    auto it = producers.find(node.input(0));
    if (it != producers.end() && it->second->op_type() == "Mul") {
      for (const auto& input : it->second->input()) {
        auto scale = ScalarOf(producers, initializers, input);
        found->sigmoid_gelu |= scale && std::abs(*scale - 1.702f) < 1e-3f;
      }
    }
  } else if (op == "Mul" && node.input_size() == 2) {
    for (int i = 0; i < 2; ++i) {
      const std::string& other = node.input(1 - i);
      const onnx::TensorProto* factor = constant(node.input(i));
      if (factor == nullptr) continue;
      const absl::string_view from = producer_op(other);
      // Gemma: the token embeddings times sqrt(hidden).
      if (from == "Gather" && ScalarOf(producers, initializers, node.input(i))) {
        const onnx::NodeProto& gather = *producers.at(other);
        found->embedding_scale |= gather.input_size() == 2 && integer_inputs.count(gather.input(1)) > 0;
      }
      // DINOv2's layer scale: a projection's output times a per-channel vector.
      found->layer_scale |= factor->dims_size() == 1 && factor->dims(0) > 1 && (from == "Add" || from == "MatMul") &&
                            (from == "MatMul" || producer_op(producers.at(other)->input(0)) == "MatMul" ||
                             producer_op(producers.at(other)->input(1)) == "MatMul");
    }
  } else if (op == "ReduceMean" && node.input_size() >= 1) {
    // RMSNorm of the heads (Qwen3's q_norm / k_norm): mean(x^2) of a head-split Reshape.
    const onnx::NodeProto* square = ProducerPastCasts(producers, node.input(0));
    if (square != nullptr && (square->op_type() == "Pow" || square->op_type() == "Mul")) {
      const onnx::NodeProto* base = ProducerPastCasts(producers, square->input(0));
      found->head_norm |= base != nullptr && base->op_type() == "Reshape";
    }
  } else if (op == "Split" || (op == "Slice" && readers(node.input(0)).size() >= 2)) {
    // A projection split into parts: Phi-3's qkv_proj and gate_up_proj.
    found->packed_projection |= producer_op(node.input(0)) == "MatMul";
  } else if (op == "Add" && node.input_size() == 2) {
    // Add(MatMul(x, W), b) read by a head split: Qwen2's Q/K/V biases.
    for (int i = 0; i < 2; ++i) {
      const onnx::TensorProto* bias = constant(node.input(i));
      if (bias == nullptr || bias->dims_size() != 1 || producer_op(node.input(1 - i)) != "MatMul") continue;
      const auto& read_by = readers(node.output(0));
      found->projection_bias |= read_by.size() == 1 && read_by[0]->op_type() == "Reshape";
    }
    // Token lookups plus a slice of a position table (Whisper's decoder: embed_positions.weight[P:P+S]).
    for (int i = 0; i < 2; ++i) {
      auto token = producers.find(node.input(i)), position = producers.find(node.input(1 - i));
      if (token == producers.end() || position == producers.end() || token->second->op_type() != "Gather" ||
          position->second->op_type() != "Slice" || token->second->input_size() != 2 ||
          integer_inputs.count(token->second->input(1)) == 0) {
        continue;
      }
      const onnx::TensorProto* table = constant(position->second->input(0));
      found->sliced_positions |= table != nullptr && table->dims_size() == 2;
    }
  } else if ((op == "Greater" || op == "Less" || op == "GreaterOrEqual" || op == "LessOrEqual") &&
             node.input_size() == 2) {
    // kv > q - W: a sliding window of W positions in the mask (Mistral, ModernBERT's local layers).
    for (const auto& input : node.input()) {
      auto it = producers.find(input);
      if (it == producers.end() || (it->second->op_type() != "Sub" && it->second->op_type() != "Add")) continue;
      for (const auto& operand : it->second->input()) {
        auto window = ScalarOf(producers, initializers, operand);
        found->position_window |= window && *window != 0.0f;
      }
    }
  }
}

}  // namespace

namespace {

// The evidence of one graph: the main graph, or a branch that reads the main graph's weights and
// inputs (`outer_initializers`, `outer_integer_inputs`).
TransformerEvidence ReadGraphEvidence(const onnx::GraphProto& graph, const InitializerMap& outer_initializers,
                                      const std::set<std::string>& outer_integer_inputs) {
  TransformerEvidence found;
  const ProducerMap producers = Producers(graph);
  InitializerMap initializers = Initializers(graph);
  initializers.insert(outer_initializers.begin(), outer_initializers.end());
  const ConsumerMap consumers = Consumers(graph);
  std::set<std::string> integer_inputs = outer_integer_inputs;
  std::optional<InputSources> sources;  // made at the first attention
  for (const auto& input : graph.input()) {
    const int32_t type = input.type().tensor_type().elem_type();
    if (type == onnx::TensorProto::INT64 || type == onnx::TensorProto::INT32) integer_inputs.insert(input.name());
  }
  int first_softmax = -1;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    const absl::string_view op = node.op_type();
    const bool standard = DefaultDomain(node);
    const onnx::NodeProto* scores =
        standard && op == "Softmax" && node.input_size() == 1 ? ScoresMatMul(producers, initializers, node.input(0), 8) : nullptr;
    if (node.domain() == kMicrosoft && op == "Attention") {
      ++found.layers;
      found.causal |= GetAttributeInt(node, "unidirectional", 0) != 0;
      if (first_softmax < 0) first_softmax = i;
    } else if (scores != nullptr) {
      ++found.layers;
      if (!sources) sources.emplace(graph, initializers);
      found.cross_attention += IsCrossAttention(*sources, *scores);
      if (first_softmax < 0) first_softmax = i;
    } else if (standard && (op == "Trilu" || (op == "Where" && node.input_size() == 3))) {
      found.causal |= op == "Trilu" || IsCausalBuffer(producers, initializers, node.input(0));
    } else if (standard && (op == "LessOrEqual" || op == "Less" || op == "GreaterOrEqual" || op == "Greater") &&
               node.input_size() == 2) {
      // Two different position ranges compared (key <= query): masking_utils' causal mask.
      const onnx::NodeProto *a = nullptr, *b = nullptr;
      found.causal |=
          FromRange(producers, node.input(0), 4, &a) && FromRange(producers, node.input(1), 4, &b) && a != b;
    } else if ((standard && op == "Gather" && node.input_size() == 2 && integer_inputs.count(node.input(1)) > 0) ||
               (node.domain() == kMicrosoft && op == "EmbedLayerNormalization")) {
      found.token_lookup = true;
    } else if (standard && op == "Conv" && first_softmax < 0) {
      found.convolution = true;
    } else if (standard && op == "ReduceMean" && node.input_size() >= 1) {
      // mean(x^2) of x itself, not of x - mean(x): RMSNorm (LLaMA, T5), not LayerNorm.
      auto pow = producers.find(node.input(0));
      if (pow != producers.end() && (pow->second->op_type() == "Pow" || pow->second->op_type() == "Mul")) {
        auto base = producers.find(pow->second->input(0));
        found.rms_norm |= base == producers.end() || base->second->op_type() != "Sub";
      }
    } else if (node.domain() == kMicrosoft && (op == "SimplifiedLayerNormalization" || op == "SkipSimplifiedLayerNormalization")) {
      found.rms_norm = true;
    }
    if (standard || node.domain() == kMicrosoft) {
      ReadFamilyEvidence(node, producers, initializers, consumers, integer_inputs, &found);
    }
    if (standard && op == "Neg" && node.output_size() == 1) {
      auto readers = consumers.find(node.output(0));
      if (readers != consumers.end()) {
        for (const onnx::NodeProto* reader : readers->second) {
          found.rotate_half |= reader->op_type() == "Concat" || reader->op_type() == "Unsqueeze";
        }
      }
    }
    found.rotate_half |= node.domain() == kMicrosoft && op == "RotaryEmbedding";
    found.sine |= standard && op == "Sin";
    found.cosine |= standard && op == "Cos";
    found.log_buckets |= standard && op == "Log";
    found.cumulative_positions |= standard && op == "CumSum";
  }
  return found;
}

// Both graphs' evidence in `into`: their layers counted together.
void Merge(const TransformerEvidence& from, TransformerEvidence* into) {
  into->layers += from.layers;
  into->cross_attention += from.cross_attention;
  for (auto flag : {&TransformerEvidence::causal, &TransformerEvidence::token_lookup, &TransformerEvidence::convolution,
                    &TransformerEvidence::rms_norm, &TransformerEvidence::sine, &TransformerEvidence::cosine,
                    &TransformerEvidence::log_buckets, &TransformerEvidence::cumulative_positions,
                    &TransformerEvidence::audio_convolution, &TransformerEvidence::distillation_token,
                    &TransformerEvidence::layer_scale, &TransformerEvidence::embedding_scale,
                    &TransformerEvidence::head_norm, &TransformerEvidence::packed_projection,
                    &TransformerEvidence::projection_bias, &TransformerEvidence::position_window,
                    &TransformerEvidence::sigmoid_gelu, &TransformerEvidence::token_types,
                    &TransformerEvidence::rotate_half, &TransformerEvidence::depthwise_convolution,
                    &TransformerEvidence::sliced_positions}) {
    into->*flag = into->*flag || from.*flag;
  }
  into->vocabulary = std::max(into->vocabulary, from.vocabulary);
  into->embedding_lookups = std::max(into->embedding_lookups, from.embedding_lookups);  // a branch's own copy
}

}  // namespace

TransformerEvidence ReadTransformerEvidence(const onnx::ModelProto& original) {
  const onnx::GraphProto& graph = original.graph();
  TransformerEvidence found = ReadGraphEvidence(graph, {}, {});
  // Optimum's merged decoder: the layers are in the branches of an If (both decoders, each counted).
  const InitializerMap initializers = Initializers(graph);
  std::set<std::string> integer_inputs;
  for (const auto& input : graph.input()) {
    const int32_t type = input.type().tensor_type().elem_type();
    if (type == onnx::TensorProto::INT64 || type == onnx::TensorProto::INT32) integer_inputs.insert(input.name());
  }
  for (const auto& node : graph.node()) {
    if (node.op_type() != "If") continue;
    ForEachBody(node, [&](const onnx::GraphProto& branch) {
      Merge(ReadGraphEvidence(branch, initializers, integer_inputs), &found);
    });
  }
  return found;
}

namespace {

// The family from the original's evidence and, if given, the optimized model's unidirectional Attention.
TransformerShape Classify(TransformerEvidence found, const onnx::ModelProto* optimized) {
  TransformerShape shape;
  shape.layers = found.layers;
  shape.cross_attention = found.cross_attention;
  if (optimized != nullptr) {
    for (const auto& node : optimized->graph().node()) {
      found.causal |=
          node.domain() == kMicrosoft && node.op_type() == "Attention" && GetAttributeInt(node, "unidirectional", 0) != 0;
    }
  }
  if (shape.layers == 0) return shape;
  const bool rotary = (found.sine && found.cosine) || found.rotate_half;
  // XLM-RoBERTa is RoBERTa's architecture; only its multilingual vocabulary (250,002 tokens) tells it.
  constexpr int64_t kMultilingualVocabulary = 250000;
  if (found.depthwise_convolution && !found.token_lookup && !found.causal) {
    shape.family = "conformer";  // attention and a depthwise convolution in each block of a speech encoder
  } else if (found.cross_attention > 0 && found.sliced_positions && !found.rms_norm) {
    shape.family = "whisper";  // a decoder whose positions are its table's rows sliced at the past's offset
  } else if (found.convolution && !found.token_lookup) {
    shape.family = found.audio_convolution    ? "whisper"
                   : found.distillation_token ? "deit"
                   : found.layer_scale        ? "dinov2"
                                              : "vit";
  } else if (found.rms_norm && found.log_buckets) {
    shape.family = "t5";  // RMSNorm and log-bucketed relative positions
  } else if (found.rms_norm && (rotary || found.causal)) {
    // RMSNorm and rotary position embeddings, or a causal RMSNorm decoder whose rotary tables are
    // stored where its rotation is not spelled as rotate_half: a LLaMA-like decoder.
    shape.family = found.embedding_scale     ? "gemma"
                   : found.head_norm         ? "qwen3"
                   : found.packed_projection ? "phi3"
                   : found.projection_bias   ? "qwen2"
                   : found.position_window   ? "mistral"
                                             : "llama";
  } else if (rotary && !found.causal) {
    shape.family = "modernbert";  // rotary positions in an encoder
  } else if (rotary) {
    shape.family = "gptneox";  // rotary positions and LayerNorm in a decoder (GPT-NeoX, GPT-J, Phi-2)
  } else if (found.causal) {
    shape.family = found.sigmoid_gelu ? "clip" : "gpt2";
  } else if (found.cumulative_positions && found.token_lookup) {
    // Position ids counted from the non-padding tokens.
    shape.family = found.vocabulary >= kMultilingualVocabulary ? "xlm-roberta" : "roberta";
  } else {
    shape.family = found.token_types ? "bert" : "distilbert";
  }
  return shape;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& KnownFamilies() {
  static const auto* families = new std::vector<std::pair<std::string, std::string>>{
      {"bert", "bert"},       {"distilbert", "bert"}, {"modernbert", "bert"},  {"roberta", "roberta"},
      {"xlm-roberta", "roberta"}, {"gpt2", "gpt2"},   {"clip", "gpt2"},        {"llama", "llama"},
      {"mistral", "llama"},   {"qwen2", "llama"},     {"qwen3", "llama"},      {"phi3", "llama"},
      {"gemma", "llama"},     {"gptneox", "llama"},   {"t5", "t5"},           {"vit", "vit"},          {"deit", "vit"},
      {"dinov2", "vit"},      {"whisper", "vit"},     {"conformer", "vit"}};
  return *families;
}

std::string FamilyKind(const std::string& family) {
  for (const auto& [name, kind] : KnownFamilies()) {
    if (name == family) return kind;
  }
  return "";
}

TransformerShape DetectTransformer(const onnx::ModelProto& original) {
  return Classify(ReadTransformerEvidence(original), nullptr);
}

v1::TransformerReport JudgeTransformerFusion(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                                             const std::vector<v1::PassReport>& passes, const ModelHints& hints) {
  return JudgeTransformerFusion(ReadTransformerEvidence(original), optimized, passes, hints);
}

v1::TransformerReport JudgeTransformerFusion(const TransformerEvidence& original, const onnx::ModelProto& optimized,
                                             const std::vector<v1::PassReport>& passes, const ModelHints& hints) {
  v1::TransformerReport report;
  TransformerShape shape = Classify(original, &optimized);
  if (shape.family.empty() && hints.family.empty()) return report;
  report.set_family(hints.family.empty() ? shape.family : hints.family);
  report.set_family_source(hints.family.empty() ? "detected" : "config");
  report.set_layers(shape.layers);

  // Heads and width: the config's, else what the fused operators say.
  std::map<std::string, int64_t> fused;
  int64_t heads = hints.num_heads, hidden = hints.hidden_size;
  InitializerMap initializers = Initializers(optimized.graph());
  // The main graph's nodes and those of its Ifs' branches (a merged decoder's layers).
  std::vector<std::reference_wrapper<const onnx::NodeProto>> nodes(optimized.graph().node().begin(),
                                                                   optimized.graph().node().end());
  for (const auto& node : optimized.graph().node()) {
    if (node.op_type() != "If") continue;
    ForEachBody(node, [&](const onnx::GraphProto& branch) {
      nodes.insert(nodes.end(), branch.node().begin(), branch.node().end());
      const InitializerMap local = Initializers(branch);
      initializers.insert(local.begin(), local.end());
    });
  }
  static const std::set<std::string> kFusedOps = {
      "Attention", "MultiHeadAttention", "GroupQueryAttention", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
      "EmbedLayerNormalization", "QEmbedLayerNormalization", "Gelu", "BiasGelu", "FastGelu", "QuickGelu",
      "LayerNormalization", "SimplifiedLayerNormalization"};
  for (const onnx::NodeProto& node : nodes) {
    if (kFusedOps.count(node.op_type()) == 0) continue;
    ++fused[node.op_type()];
    if ((node.op_type() == "MultiHeadAttention" || node.op_type() == "GroupQueryAttention") && heads == 0) {
      heads = GetAttributeInt(node, "num_heads", 0);
    }
    if (node.op_type() == "Attention") {
      if (heads == 0) heads = GetAttributeInt(node, "num_heads", 0);
      auto weight = initializers.find(node.input_size() > 1 ? node.input(1) : "");
      if (hidden == 0 && weight != initializers.end() && weight->second->dims_size() == 2) {
        hidden = weight->second->dims(1) / 3;
      }
    }
  }
  for (const onnx::NodeProto& node : nodes) {
    if (hidden != 0) break;
    if (node.op_type().find("LayerNormalization") == std::string::npos || node.input_size() < 2) continue;
    const int gamma = node.op_type().find("EmbedLayerNormalization") != std::string::npos
                          ? 5
                          : (node.op_type().rfind("Skip", 0) == 0 ? 2 : 1);
    auto weight = initializers.find(node.input_size() > gamma ? node.input(gamma) : "");
    if (weight != initializers.end() && weight->second->dims_size() == 1) hidden = weight->second->dims(0);
  }
  report.set_num_heads(static_cast<int32_t>(heads));
  report.set_hidden_size(static_cast<int32_t>(hidden));
  for (const auto& [op, count] : fused) (*report.mutable_fused_ops())[op] = count;

  // What a fully fused model of the family has, per operator group, and the pass that makes it.
  struct Expectation {
    std::string label;
    std::vector<std::string> ops;
    int64_t count;
    std::string pass;
  };
  // A decoder layer of an encoder-decoder holds two attentions (self and cross), three residual norms
  // and one MLP: each cross-attention adds one SkipLayerNormalization and no Gelu.
  const int64_t layers = shape.layers, cross = shape.cross_attention;
  std::vector<Expectation> expected = {
      {"Attention", {"Attention", "MultiHeadAttention", "GroupQueryAttention"}, layers, "fuse_attention"},
      {"SkipLayerNormalization", {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}, 2 * layers - cross,
       "fuse_skip_layer_norm"},
      {"Gelu", {"Gelu", "BiasGelu", "FastGelu", "QuickGelu"}, layers - cross, "fuse_gelu"},
  };
  const std::string& family = report.family();
  const std::string kind = FamilyKind(family);
  if (kind == "t5") expected.erase(expected.begin() + 2);  // ReLU feed-forward: nothing to fuse there
  // ModernBERT's embeddings are the token table and a norm: no position table for EmbedLayerNormalization;
  // nor is there one to take where fewer than two tables are looked up (TransformerEvidence).
  if ((kind == "bert" || kind == "roberta" || kind == "gpt2") && family != "modernbert" &&
      original.embedding_lookups >= 2) {
    // Its int8 form (quantize_embeddings_int8) counts as fused.
    expected.push_back({"EmbedLayerNormalization", {"EmbedLayerNormalization", "QEmbedLayerNormalization"}, 1,
                        "fuse_embed_layer_norm"});
  }
  // The last run of each pass says why it left what it left.
  std::map<std::string, const v1::PassReport*> last_run;
  for (const auto& pass : passes) last_run[pass.name()] = &pass;
  bool any_fusion = false;
  for (const Expectation& expectation : expected) any_fusion |= last_run.count(expectation.pass) > 0;
  bool fully_fused = true;
  for (const Expectation& expectation : expected) {
    (*report.mutable_expected_ops())[expectation.label] = expectation.count;
    int64_t have = 0;
    for (const auto& op : expectation.ops) {
      auto it = fused.find(op);
      if (it != fused.end()) have += it->second;
    }
    (*report.mutable_fused_kinds())[expectation.label] = have;
    if (have >= expectation.count) continue;
    fully_fused = false;
    if (!any_fusion) continue;
    std::string missing = absl::StrCat(expectation.label, ": ", have, " of ", expectation.count);
    auto run = last_run.find(expectation.pass);
    if (run == last_run.end()) {
      absl::StrAppend(&missing, " (", expectation.pass, " is not in the pipeline)");
    } else if (run->second->skipped_size() > 0) {
      std::vector<std::string> reasons;
      for (const auto& skip : run->second->skipped()) reasons.push_back(absl::StrCat(skip.count(), "x ", skip.reason()));
      absl::StrAppend(&missing, " (", absl::StrJoin(reasons, "; "), ")");
    } else {
      absl::StrAppend(&missing, " (", expectation.pass, " found no pattern it knows)");
    }
    report.add_missing(std::move(missing));
  }
  if (!fully_fused && !any_fusion) {
    report.add_missing("the transformer fusions are not in this pipeline; the transformer preset runs them");
  }
  report.set_fully_fused(fully_fused);
  return report;
}

}  // namespace onnxopt
