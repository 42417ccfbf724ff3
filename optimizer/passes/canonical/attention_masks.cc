#include "optimizer/passes/canonical/attention_masks.h"

#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/subgraph_session.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

// A mask is shape arithmetic over a few inputs; a bigger subgraph is something else.
constexpr size_t kMaxMaskNodes = 400;

struct ProbeCase {
  int64_t batch;
  int64_t length;
};
constexpr ProbeCase kProbeCases[] = {{1, 1}, {2, 7}, {3, 40}};
// A mask that compares positions against a constant (a sliding window) is also probed one step past
// its largest integer constant, up to this length; a larger constant makes the mask unknown.
constexpr int64_t kMaxProbeLength = 4096;
constexpr int64_t kMaxProbeElements = int64_t{1} << 26;

// The largest magnitude among the one-element integer constants the mask's nodes read.
int64_t LargestIntegerConstant(const Graph& graph, const std::vector<const Node*>& nodes) {
  int64_t largest = 0;
  for (const Node* node : nodes) {
    for (const std::string& input : node->proto().input()) {
      const onnx::TensorProto* tensor = graph.Initializer(input);
      if (tensor == nullptr || (tensor->data_type() != onnx::TensorProto::INT64 &&
                                tensor->data_type() != onnx::TensorProto::INT32)) {
        continue;
      }
      auto values = TensorInts(*tensor);
      if (!values || values->size() != 1) continue;
      const int64_t v = (*values)[0];
      if (v == std::numeric_limits<int64_t>::min() || v == std::numeric_limits<int64_t>::max() ||
          v == std::numeric_limits<int32_t>::max() || v == std::numeric_limits<int32_t>::min()) {
        continue;  // "to the end" bounds, not positions
      }
      largest = std::max(largest, v < 0 ? -v : v);
    }
  }
  return largest;
}

// The nodes `value` is computed from, in graph order, and the graph inputs they read. False if that
// takes a subgraph-carrying node or more than kMaxMaskNodes nodes.
bool CollectAncestors(const Graph& graph, const std::string& value, std::vector<const Node*>* nodes,
                      std::set<std::string>* inputs) {
  std::unordered_set<const Node*> seen;
  std::vector<std::string> pending = {value};
  while (!pending.empty()) {
    const std::string current = pending.back();
    pending.pop_back();
    if (current.empty() || graph.Initializer(current) != nullptr) continue;
    if (graph.IsGraphInput(current)) {
      inputs->insert(current);
      continue;
    }
    const Node* producer = graph.Producer(current);
    if (producer == nullptr) return false;  // a value of an outer graph
    if (!seen.insert(producer).second) continue;
    if (!producer->subgraphs().empty() || seen.size() > kMaxMaskNodes) return false;
    for (const std::string& input : producer->proto().input()) pending.push_back(input);
  }
  for (const Node* node : graph.Nodes()) {
    if (seen.count(node) > 0) nodes->push_back(node);
  }
  return true;
}

// Writes the small number `n` (0 to 3; bools: n != 0) as element `index` of a raw buffer of `type`.
// Values beyond 0/1 tell `!= 0` (what Attention's raw mask means) from `== 1`, and a padding id of 2
// or 3 from no padding.
bool WriteSmall(int32_t type, int n, size_t index, std::string* raw) {
  char* at = raw->data() + index * ElementSize(type);
  switch (type) {
    case onnx::TensorProto::BOOL: *at = n != 0 ? 1 : 0; return true;
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::INT8: *at = static_cast<char>(n); return true;
    case onnx::TensorProto::INT32: {
      const int32_t v = n;
      std::memcpy(at, &v, sizeof(v));
      return true;
    }
    case onnx::TensorProto::INT64: {
      const int64_t v = n;
      std::memcpy(at, &v, sizeof(v));
      return true;
    }
    case onnx::TensorProto::FLOAT: {
      const float v = static_cast<float>(n);
      std::memcpy(at, &v, sizeof(v));
      return true;
    }
    default: return false;
  }
}

struct ProbeInput {
  const onnx::ValueInfoProto* info;
  bool random;     // of a type that holds small numbers: filled with 0-3 (zeros otherwise)
  bool candidate;  // and of rank 2: a candidate padding mask
};

// The probe inputs for one case, or nullopt when a dimension cannot be bound (an unnamed dynamic dim,
// or one name used both as batch and as length).
std::optional<std::vector<onnx::TensorProto>> MakeProbeInputs(const std::vector<ProbeInput>& inputs, ProbeCase probe,
                                                               std::mt19937* random) {
  std::map<std::string, int> roles;  // dim name -> 0 batch, 1 length
  std::vector<onnx::TensorProto> tensors;
  for (const ProbeInput& input : inputs) {
    const auto& type = input.info->type().tensor_type();
    onnx::TensorProto tensor;
    tensor.set_name(input.info->name());
    tensor.set_data_type(type.elem_type());
    int64_t count = 1;
    for (int i = 0; i < type.shape().dim_size(); ++i) {
      const auto& dim = type.shape().dim(i);
      int64_t size = dim.dim_value();
      if (dim.has_dim_value() && dim.dim_value() < 0) return std::nullopt;
      if (!dim.has_dim_value()) {
        if (dim.dim_param().empty()) return std::nullopt;
        const int role = i == 0 ? 0 : 1;
        auto [it, inserted] = roles.emplace(dim.dim_param(), role);
        if (!inserted && it->second != role) return std::nullopt;
        size = role == 0 ? probe.batch : probe.length;
      }
      tensor.add_dims(size);
      count *= size;
      if (count > kMaxProbeElements) return std::nullopt;
    }
    const size_t bytes = ElementSize(type.elem_type());
    if (bytes == 0) return std::nullopt;
    std::string raw(static_cast<size_t>(count) * bytes, '\0');
    if (input.random) {
      for (int64_t i = 0; i < count; ++i) WriteSmall(type.elem_type(), static_cast<int>((*random)() & 3), static_cast<size_t>(i), &raw);
    }
    tensor.set_raw_data(std::move(raw));
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

bool NonZero(const onnx::TensorProto& tensor, size_t index) {
  const size_t bytes = ElementSize(tensor.data_type());
  const std::string& raw = tensor.raw_data();
  for (size_t i = 0; i < bytes; ++i) {
    if (raw[index * bytes + i] != 0) return true;
  }
  return false;
}

}  // namespace

MaskMeaning ProbeMaskMeaning(const Graph& graph, const PassContext& context, const std::string& mask) {
  MaskMeaning meaning;
  std::vector<const Node*> nodes;
  std::set<std::string> input_names;
  if (!CollectAncestors(graph, mask, &nodes, &input_names)) {
    meaning.why = "the mask is computed by more than shape arithmetic";
    return meaning;
  }
  std::vector<ProbeInput> inputs;
  for (const auto& info : graph.proto().input()) {
    if (input_names.count(info.name()) == 0) continue;
    if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) {
      meaning.why = absl::StrCat("input ", info.name(), " has no tensor shape");
      return meaning;
    }
    const int32_t type = info.type().tensor_type().elem_type();
    const bool small = type == onnx::TensorProto::BOOL || type == onnx::TensorProto::UINT8 ||
                       type == onnx::TensorProto::INT8 || type == onnx::TensorProto::INT32 ||
                       type == onnx::TensorProto::INT64 || type == onnx::TensorProto::FLOAT;
    inputs.push_back({&info, small, small && info.type().tensor_type().shape().dim_size() == 2});
  }

  std::vector<onnx::ValueInfoProto> infos;
  for (const ProbeInput& input : inputs) infos.push_back(*input.info);
  auto session = SubgraphSession(graph, context, nodes, infos, {mask}, "attention_mask_probe");
  if (!session.ok()) {
    meaning.why = "the mask's subgraph does not run on its own";
    return meaning;
  }

  std::mt19937 random(20261123);
  // Which meanings every probe so far agrees with; a padding meaning per candidate input.
  bool all_true = true, causal = true, bias_shaped = true;
  std::set<std::string> padding, causal_padding;
  for (const ProbeInput& input : inputs) {
    if (input.candidate) padding.insert(input.info->name());
  }
  std::vector<ProbeCase> cases(std::begin(kProbeCases), std::end(kProbeCases));
  const int64_t constant = LargestIntegerConstant(graph, nodes);
  if (constant + 2 > kMaxProbeLength) {
    meaning.why = absl::StrCat("the mask compares positions against ", constant, ", longer than can be probed");
    return meaning;
  }
  if (constant + 2 > cases.back().length) cases.push_back({1, constant + 2});
  causal_padding = padding;
  try {
  for (const ProbeCase& probe_case : cases) {
    auto tensors = MakeProbeInputs(inputs, probe_case, &random);
    if (!tensors) {
      meaning.why = "the inputs' dynamic dimensions are not named batch-first";
      return meaning;
    }
    std::vector<Ort::Value> values;
    std::vector<const char*> names;
    for (const onnx::TensorProto& tensor : *tensors) {
      auto value = TensorProtoToOrtValue(tensor);
      if (!value.ok()) {
        meaning.why = "a probe input cannot be made";
        return meaning;
      }
      values.push_back(*std::move(value));
      names.push_back(tensor.name().c_str());
    }
    const char* output_name = mask.c_str();
    std::vector<Ort::Value> results;
    try {
      results = (*session)->Run(Ort::RunOptions{nullptr}, names.data(), values.data(), values.size(), &output_name, 1);
    } catch (const Ort::Exception& e) {
      meaning.why = "the mask's subgraph fails on probe inputs";
      return meaning;
    }
    const auto info = results[0].GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL || shape.size() != 4) {
      meaning.why = "the mask is not a 4-D boolean tensor";
      return meaning;
    }
    bias_shaped &= (shape[0] == probe_case.batch || shape[0] == 1) && shape[1] == 1 &&
                   shape[2] == probe_case.length && shape[3] == probe_case.length;
    const bool* data = results[0].GetTensorData<bool>();
    const size_t count = info.GetElementCount();
    const int64_t keys = shape[3], queries = shape[2];
    causal &= queries == keys;  // queries and keys are the same tokens
    for (size_t i = 0; i < count; ++i) {
      const int64_t t = static_cast<int64_t>(i) % keys;
      const int64_t q = (static_cast<int64_t>(i) / keys) % queries;
      all_true &= data[i];
      causal &= data[i] == (t <= q);
    }
    // mask[b, h, q, t] == (candidate[b, t] != 0), alone or with t <= q.
    for (std::set<std::string>* kept : {&padding, &causal_padding}) {
      const bool with_causal = kept == &causal_padding;
      for (auto it = kept->begin(); it != kept->end();) {
        const onnx::TensorProto* candidate = nullptr;
        for (const auto& tensor : *tensors) {
          if (tensor.name() == *it) candidate = &tensor;
        }
        bool same = candidate->dims(0) == shape[0] && candidate->dims(1) == keys && (!with_causal || queries == keys);
        for (size_t i = 0; i < count && same; ++i) {
          const int64_t t = static_cast<int64_t>(i) % keys;
          const int64_t q = (static_cast<int64_t>(i) / keys) % queries;
          const int64_t b = static_cast<int64_t>(i) / (shape[1] * queries * keys);
          same = data[i] == (NonZero(*candidate, static_cast<size_t>(b * keys + t)) && (!with_causal || t <= q));
        }
        it = same ? std::next(it) : kept->erase(it);
      }
    }
  }
  } catch (const std::exception& e) {  // Ort::Exception and allocation failures alike
    meaning.why = absl::StrCat("the mask's subgraph fails on probe inputs: ", e.what());
    return meaning;
  }
  meaning.bias_shaped = bias_shaped;
  // The probes include a length of 1, where causal and all-true coincide: all-true wins only when the
  // mask is all true at every length.
  if (all_true) {
    meaning.kind = MaskMeaning::Kind::kAllTrue;
  } else if (causal) {
    meaning.kind = MaskMeaning::Kind::kCausal;
  } else if (padding.size() == 1) {
    meaning.kind = MaskMeaning::Kind::kKeyPadding;
    meaning.padding_input = *padding.begin();
  } else if (causal_padding.size() == 1) {
    meaning.kind = MaskMeaning::Kind::kCausalKeyPadding;
    meaning.padding_input = *causal_padding.begin();
  } else {
    meaning.why = "the mask is not all true, causal, a key-padding mask of one [B, T] input, or causal and padding";
  }
  return meaning;
}

}  // namespace onnxopt
