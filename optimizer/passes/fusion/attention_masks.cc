#include "optimizer/passes/fusion/attention_masks.h"

#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "optimizer/cache_interface.h"
#include "optimizer/passes/constants.h"
#include "optimizer/passes/match.h"
#include "optimizer/passes/subgraph_session.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
namespace {

// A mask is shape arithmetic over a few inputs; a bigger subgraph is something else.
constexpr size_t kMaxMaskNodes = 400;

struct ProbeCase {
  int64_t batch;
  int64_t length;  // the new tokens
  int64_t past = 0;
};
constexpr ProbeCase kProbeCases[] = {{1, 1}, {2, 7}, {3, 40}};
// With a key/value cache also a decode step and a chunk after a past.
constexpr ProbeCase kCacheProbeCases[] = {{2, 1, 9}, {3, 5, 11}};
// A mask that compares positions against a constant (a sliding window) is also probed one step past
// its largest integer constant, up to this length; a larger constant makes the mask unknown.
// 4096 + 2: a window of 4096 (Mistral's, Gemma 2's) is probed. The probe at that length holds its
// [1, 1, L, L] mask and the subgraph's intermediates (an index tensor [L, L, 2] of int64: 270 MB) for the
// moment it runs.
constexpr int64_t kMaxProbeLength = 4098;
constexpr int64_t kMaxProbeElements = int64_t{1} << 26;

// The magnitudes of the one-element integer constants the mask's nodes read ("to the end" bounds aside).
std::set<int64_t> IntegerConstants(const Graph& graph, const std::vector<const Node*>& nodes) {
  std::set<int64_t> constants;
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
      constants.insert(v < 0 ? -v : v);
    }
  }
  return constants;
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
  bool candidate;  // and [B, T], [B, 1, T] or [B, 1, 1, T] (WeNet's, ESPnet's masks): a candidate padding mask
};

// A candidate padding mask's length T, its last dim.
int64_t KeysOf(const onnx::TensorProto& candidate) { return candidate.dims(candidate.dims_size() - 1); }

// True if `shape` is [B, T], [B, 1, T] or [B, 1, 1, T].
bool PaddingShaped(const onnx::TensorShapeProto& shape) {
  if (shape.dim_size() < 2 || shape.dim_size() > 4) return false;
  for (int i = 1; i + 1 < shape.dim_size(); ++i) {
    if (!shape.dim(i).has_dim_value() || shape.dim(i).dim_value() != 1) return false;
  }
  return true;
}

// The probe inputs for one case, or nullopt when a dimension cannot be bound (an unnamed dynamic dim,
// or one name used both as batch and as length). A cache's dims take their roles (past, new, total).
// `largest`: the small numbers go up to it (3; 1 for an additive mask, whose (1 - m) * min holds for
// 0/1 masks only).
std::optional<std::vector<onnx::TensorProto>> MakeProbeInputs(const std::vector<ProbeInput>& inputs, ProbeCase probe, int largest,
                                                               const std::optional<CacheInterface>& cache,
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
        std::optional<int64_t> cache_role;
        if (cache && role == 1) cache_role = cache->RoleValue(dim.dim_param(), probe.past, probe.length);
        size = cache_role ? *cache_role : role == 0 ? probe.batch : probe.length;
      }
      tensor.add_dims(size);
      count *= size;
      if (count > kMaxProbeElements) return std::nullopt;
    }
    const size_t bytes = ElementSize(type.elem_type());
    if (bytes == 0) return std::nullopt;
    std::string raw(static_cast<size_t>(count) * bytes, '\0');
    if (input.random) {
      for (int64_t i = 0; i < count; ++i) {
        WriteSmall(type.elem_type(), static_cast<int>((*random)() % static_cast<unsigned>(largest + 1)),
                   static_cast<size_t>(i), &raw);
      }
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

// The graph inputs the mask reads, as probe inputs; a failure says why the mask cannot be probed.
MatchResult<std::vector<ProbeInput>> ProbeInputsOf(const Graph& graph, const std::set<std::string>& names) {
  std::vector<ProbeInput> inputs;
  for (const auto& info : graph.proto().input()) {
    if (names.count(info.name()) == 0) continue;
    if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) {
      return Fail(absl::StrCat("input ", info.name(), " has no tensor shape"));
    }
    const int32_t type = info.type().tensor_type().elem_type();
    const bool small = type == onnx::TensorProto::BOOL || type == onnx::TensorProto::UINT8 ||
                       type == onnx::TensorProto::INT8 || type == onnx::TensorProto::INT32 ||
                       type == onnx::TensorProto::INT64 || type == onnx::TensorProto::FLOAT;
    inputs.push_back({&info, small, small && PaddingShaped(info.type().tensor_type().shape())});
  }
  return inputs;
}

// The mask the subgraph computes from `tensors`.
// The mask the subgraph computes from `tensors`. An additive float mask is read as the boolean mask of its
// zeros: every value must be 0 or at most -1e4 (-inf included), anything else is no mask.
MatchResult<Ort::Value> RunProbe(Ort::Session& session, const std::vector<onnx::TensorProto>& tensors,
                                 const std::string& mask, bool additive) {
  std::vector<Ort::Value> values;
  std::vector<const char*> names;
  for (const onnx::TensorProto& tensor : tensors) {
    auto value = TensorProtoToOrtValue(tensor);
    if (!value.ok()) return Fail("a probe input cannot be made");
    values.push_back(*std::move(value));
    names.push_back(tensor.name().c_str());
  }
  const char* output_name = mask.c_str();
  std::vector<Ort::Value> results;
  try {
    results = session.Run(Ort::RunOptions{nullptr}, names.data(), values.data(), values.size(), &output_name, 1);
  } catch (const Ort::Exception& e) {
    return Fail("the mask's subgraph fails on probe inputs");
  }
  const auto info = results[0].GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> shape = info.GetShape();
  if (shape.size() != 4) return Fail("the mask is not 4-D");
  if (!additive) {
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL) return Fail("the mask is not boolean");
    return std::move(results[0]);
  }
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return Fail("the additive mask is not float");
  const float* data = results[0].GetTensorData<float>();
  const size_t count = info.GetElementCount();
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value kept = Ort::Value::CreateTensor<bool>(allocator, shape.data(), shape.size());
  bool* out = kept.GetTensorMutableData<bool>();
  for (size_t i = 0; i < count; ++i) {
    if (data[i] != 0.0f && !(data[i] <= -1e4f)) return Fail("the additive mask holds values other than 0 and large negatives");
    out[i] = data[i] == 0.0f;
  }
  return kept;
}

// The probe input named `name`, or nullptr.
const onnx::TensorProto* TensorNamed(const std::vector<onnx::TensorProto>& tensors, const std::string& name) {
  for (const auto& tensor : tensors) {
    if (tensor.name() == name) return &tensor;
  }
  return nullptr;
}

// The meanings every probe so far agrees with; a padding meaning per candidate input.
class Agreement {
 public:
  // `windows`: the sliding-window widths to check (the mask's constants c, and c + 1 for a `<=` spelling).
  Agreement(const std::vector<ProbeInput>& inputs, const std::set<int64_t>& windows) {
    for (const ProbeInput& input : inputs) {
      if (input.candidate) padding_.insert(input.info->name());
    }
    causal_padding_ = padding_;
    inverted_padding_ = padding_;
    for (int64_t window : windows) {
      windows_.insert({window, ""});
      for (const std::string& input : padding_) windows_.insert({window, input});
    }
  }

  // Narrows the meanings down to those the mask computed from `tensors` shows.
  void Observe(const ProbeCase& probe, const std::vector<onnx::TensorProto>& tensors, const Ort::Value& mask) {
    const auto info = mask.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    bias_shaped_ &= (shape[0] == probe.batch || shape[0] == 1) && shape[1] == 1 && shape[2] == probe.length &&
                    shape[3] == probe.past + probe.length;
    const bool* data = mask.GetTensorData<bool>();
    const size_t count = info.GetElementCount();
    const int64_t keys = shape[3], queries = shape[2];
    // The queries are the last `queries` of the keys' tokens (after a past, if any): query q is at
    // position q + past.
    const int64_t past = keys - queries;
    causal_ &= past >= 0;
    within_causal_ &= past >= 0;
    for (size_t i = 0; i < count; ++i) {
      const int64_t t = static_cast<int64_t>(i) % keys;
      const int64_t q = (static_cast<int64_t>(i) / keys) % queries;
      all_true_ &= data[i];
      all_false_ &= !data[i];
      causal_ &= data[i] == (t <= q + past);
      within_causal_ &= !data[i] || t <= q + past;
    }
    // mask[b, h, q, t] == (candidate[b, t] != 0), alone or with t <= q.
    // Or mask[b, h, q, t] == (candidate[b, t] == 0): a mask that is true on padding (NeMo's pad_mask).
    for (std::set<std::string>* kept : {&padding_, &causal_padding_, &inverted_padding_}) {
      const bool with_causal = kept == &causal_padding_;
      const bool inverted = kept == &inverted_padding_;
      for (auto it = kept->begin(); it != kept->end();) {
        const onnx::TensorProto* candidate = TensorNamed(tensors, *it);
        bool same = candidate->dims(0) == shape[0] && KeysOf(*candidate) == keys && (!with_causal || past >= 0);
        for (size_t i = 0; i < count && same; ++i) {
          const int64_t t = static_cast<int64_t>(i) % keys;
          const int64_t q = (static_cast<int64_t>(i) / keys) % queries;
          const int64_t b = static_cast<int64_t>(i) / (shape[1] * queries * keys);
          same = data[i] == ((NonZero(*candidate, static_cast<size_t>(b * keys + t)) != inverted) &&
                             (!with_causal || t <= q + past));
        }
        it = same ? std::next(it) : kept->erase(it);
      }
    }
    // mask[b, h, q, t] == (t <= q + past && q + past - t < W), with a candidate's padding or without.
    for (auto it = windows_.begin(); it != windows_.end();) {
      const auto& [window, input] = *it;
      const onnx::TensorProto* candidate = TensorNamed(tensors, input);
      bool same = past >= 0 && (candidate == nullptr || (candidate->dims(0) == shape[0] && KeysOf(*candidate) == keys));
      for (size_t i = 0; i < count && same; ++i) {
        const int64_t t = static_cast<int64_t>(i) % keys;
        const int64_t q = (static_cast<int64_t>(i) / keys) % queries;
        const int64_t b = static_cast<int64_t>(i) / (shape[1] * queries * keys);
        const bool kept = t <= q + past && q + past - t < window &&
                          (candidate == nullptr || NonZero(*candidate, static_cast<size_t>(b * keys + t)));
        same = data[i] == kept;
      }
      it = same ? std::next(it) : windows_.erase(it);
    }
  }

  MaskMeaning Conclude() const {
    MaskMeaning meaning;
    meaning.bias_shaped = bias_shaped_;
    meaning.within_causal = within_causal_;
    // The probes include a length of 1, where causal and all-true coincide: all-true wins only when
    // the mask is all true at every length.
    if (all_true_) {
      meaning.kind = MaskMeaning::Kind::kAllTrue;
    } else if (all_false_) {
      meaning.kind = MaskMeaning::Kind::kAllFalse;
    } else if (causal_) {
      meaning.kind = MaskMeaning::Kind::kCausal;
    } else if (padding_.size() == 1) {
      meaning.kind = MaskMeaning::Kind::kKeyPadding;
      meaning.padding_input = *padding_.begin();
    } else if (inverted_padding_.size() == 1) {
      meaning.kind = MaskMeaning::Kind::kKeyPadding;
      meaning.padding_input = *inverted_padding_.begin();
      meaning.padding_inverted = true;
    } else if (causal_padding_.size() == 1) {
      meaning.kind = MaskMeaning::Kind::kCausalKeyPadding;
      meaning.padding_input = *causal_padding_.begin();
    } else if (windows_.size() == 1) {
      // Probed past W: one width fits (a window of W and one of W + 1 differ at length W + 2).
      const auto& [window, input] = *windows_.begin();
      meaning.kind = input.empty() ? MaskMeaning::Kind::kSlidingWindow : MaskMeaning::Kind::kSlidingWindowKeyPadding;
      meaning.window = window;
      meaning.padding_input = input;
    } else {
      meaning.why = "the mask is not all true, causal, a key-padding mask of one [B, T] input, or causal and padding";
    }
    return meaning;
  }

 private:
  bool all_true_ = true, all_false_ = true, causal_ = true, bias_shaped_ = true, within_causal_ = true;
  std::set<std::string> padding_, causal_padding_, inverted_padding_;
  std::set<std::pair<int64_t, std::string>> windows_;  // (W, padding input or "") still agreeing
};

// The probe cases: kProbeCases (and kCacheProbeCases with a cache), and one length past the largest
// integer constant the mask reads.
MatchResult<std::vector<ProbeCase>> ProbeCases(const std::set<int64_t>& constants, bool cache) {
  std::vector<ProbeCase> cases(std::begin(kProbeCases), std::end(kProbeCases));
  if (cache) cases.insert(cases.end(), std::begin(kCacheProbeCases), std::end(kCacheProbeCases));
  const int64_t constant = constants.empty() ? 0 : *constants.rbegin();
  if (constant + 2 > kMaxProbeLength) {
    return Fail(absl::StrCat("the mask compares positions against ", constant, ", longer than can be probed"));
  }
  if (constant + 2 > std::end(kProbeCases)[-1].length) cases.push_back({1, constant + 2});
  return cases;
}

MatchResult<MaskMeaning> Probe(const Graph& graph, const PassContext& context, const std::string& mask, bool additive) {
  std::vector<const Node*> nodes;
  std::set<std::string> input_names;
  if (!CollectAncestors(graph, mask, &nodes, &input_names)) {
    return Fail("the mask is computed by more than shape arithmetic");
  }
  MatchResult<std::vector<ProbeInput>> inputs = ProbeInputsOf(graph, input_names);
  if (!inputs) return inputs.failure();
  std::vector<onnx::ValueInfoProto> infos;
  for (const ProbeInput& input : *inputs) infos.push_back(*input.info);
  auto session = SubgraphSession(graph, context, nodes, infos, {mask}, "attention_mask_probe");
  if (!session.ok()) return Fail("the mask's subgraph does not run on its own");
  const std::optional<CacheInterface> cache = FindCacheInterface(graph.proto());
  const std::set<int64_t> constants = IntegerConstants(graph, nodes);
  MatchResult<std::vector<ProbeCase>> cases = ProbeCases(constants, cache.has_value());
  if (!cases) return cases.failure();
  std::set<int64_t> windows;
  for (int64_t c : constants) {
    if (c >= 1) windows.insert({c, c + 1});
  }
  std::mt19937 random(20261123);
  Agreement agreement(*inputs, windows);
  try {
    for (const ProbeCase& probe_case : *cases) {
      auto tensors = MakeProbeInputs(*inputs, probe_case, additive ? 1 : 3, cache, &random);
      if (!tensors) return Fail("the inputs' dynamic dimensions are not named batch-first");
      MatchResult<Ort::Value> result = RunProbe(**session, *tensors, mask, additive);
      if (!result) return result.failure();
      agreement.Observe(probe_case, *tensors, *result);
    }
  } catch (const std::exception& e) {  // Ort::Exception and allocation failures alike
    return Fail(absl::StrCat("the mask's subgraph fails on probe inputs: ", e.what()));
  }
  return agreement.Conclude();
}

}  // namespace

MaskMeaning ProbeMaskMeaning(const Graph& graph, const PassContext& context, const std::string& mask, bool additive) {
  MatchResult<MaskMeaning> meaning = Probe(graph, context, mask, additive);
  if (meaning) return *std::move(meaning);
  MaskMeaning unknown;
  unknown.why = meaning.reason();
  return unknown;
}

const MaskMeaning& MaskProbes::Probe(const Graph& graph, const PassContext& context, const std::string& mask,
                                     bool additive) {
  auto known = probed_.find({mask, additive});
  if (known == probed_.end()) {
    known = probed_.emplace(std::make_pair(mask, additive), ProbeMaskMeaning(graph, context, mask, additive)).first;
  }
  return known->second;
}

}  // namespace onnxopt
