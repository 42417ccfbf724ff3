#include "optimizer/validation/input_generator.h"

#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optimizer/cache_interface.h"
#include "optimizer/failure.h"
#include "optimizer/graph_bodies.h"
#include "optimizer/model_io.h"
#include "optimizer/tensor_convert.h"

namespace onnxopt {
double MaskPadding(const v1::ValidationConfig& config) {
  return config.has_mask_padding() ? config.mask_padding() : kDefaultMaskPadding;
}

namespace {

// Number of rows of the embedding table that `input` indexes through a Gather (possibly after a
// Cast), or 0 if it indexes none.
using InitializerIndex = std::map<std::string, const onnx::TensorProto*>;

// The nodes of `graph` and of the bodies of its If/Loop/Scan nodes, depth first: a merged decoder
// (Optimum's If on use_cache_branch) reads its inputs inside the branches.
void CollectNodes(const onnx::GraphProto& graph, std::vector<const onnx::NodeProto*>* nodes) {
  for (const auto& node : graph.node()) {
    nodes->push_back(&node);
    ForEachBody(node, [&](const onnx::GraphProto& body) { CollectNodes(body, nodes); });
  }
}

std::vector<const onnx::NodeProto*> AllNodes(const onnx::GraphProto& graph) {
  std::vector<const onnx::NodeProto*> nodes;
  CollectNodes(graph, &nodes);
  return nodes;
}

// The initializers of `graph` and of its bodies (a body's own shadow none of the outer ones here).
void IndexInitializers(const onnx::GraphProto& graph, InitializerIndex* index) {
  for (const auto& tensor : graph.initializer()) index->emplace(tensor.name(), &tensor);
  for (const auto& node : graph.node()) {
    ForEachBody(node, [&](const onnx::GraphProto& body) { IndexInitializers(body, index); });
  }
}

// `input` and its Casts.
std::vector<std::string> Aliases(const std::vector<const onnx::NodeProto*>& nodes, const std::string& input) {
  std::vector<std::string> aliases = {input};
  for (const onnx::NodeProto* node : nodes) {
    if (node->op_type() == "Cast" && node->input_size() == 1 && node->input(0) == input) {
      aliases.push_back(node->output(0));
    }
  }
  return aliases;
}

// True if `input` (or its Cast) indexes a table computed at run time: Gather(T, input) with T no
// initializer, such as transformers 4.3x's cos_cached[:seq_len][position_ids], whose rows are only the
// sequence's.
bool IndexesComputedTable(const std::vector<const onnx::NodeProto*>& nodes, const InitializerIndex& initializers,
                          const std::string& input) {
  const std::vector<std::string> aliases = Aliases(nodes, input);
  for (const onnx::NodeProto* node : nodes) {
    if (node->op_type() == "Gather" && node->input_size() == 2 && initializers.count(node->input(0)) == 0 &&
        std::find(aliases.begin(), aliases.end(), node->input(1)) != aliases.end()) {
      return true;
    }
  }
  return false;
}

int64_t IndexedTableRows(const std::vector<const onnx::NodeProto*>& nodes, const InitializerIndex& initializers,
                         const std::string& input) {
  const std::vector<std::string> aliases = Aliases(nodes, input);
  for (const onnx::NodeProto* node : nodes) {
    if (node->op_type() != "Gather" || node->input_size() != 2) continue;
    if (std::find(aliases.begin(), aliases.end(), node->input(1)) == aliases.end()) continue;
    auto table = initializers.find(node->input(0));
    if (table == initializers.end()) continue;
    int64_t axis = 0;
    for (const auto& attribute : node->attribute()) {
      if (attribute.name() == "axis") axis = attribute.i();
    }
    const int rank = table->second->dims_size();
    if (axis < 0) axis += rank;
    if (axis >= 0 && axis < rank) return table->second->dims(static_cast<int>(axis));
  }
  return 0;
}

template <typename T, typename Fill>
Ort::Value MakeTensor(const std::vector<int64_t>& shape, Fill fill) {
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value value = Ort::Value::CreateTensor<T>(allocator, shape.data(), shape.size());
  T* data = value.GetTensorMutableData<T>();
  const size_t count = value.GetTensorTypeAndShapeInfo().GetElementCount();
  for (size_t i = 0; i < count; ++i) data[i] = fill();
  return value;
}

// Zeros at the end of each row of a mask [.., S]: row r of R loses mask_padding * S * (R - r) / R
// positions, so the rows differ, and at least one position stays. `left_on_even_rows` (models with a
// key/value cache, whose generation batches are padded on the left): rows 0, 2, ... lose their first
// positions instead, so one batch holds both sides.
template <typename T>
bool PadMask(Ort::Value& value, const std::vector<int64_t>& shape, double padding, bool left_on_even_rows) {
  if (padding <= 0 || shape.empty() || shape.back() <= 1) return false;
  const int64_t length = shape.back();
  const size_t count = value.GetTensorTypeAndShapeInfo().GetElementCount();
  const int64_t rows = static_cast<int64_t>(count) / length;
  T* data = value.GetTensorMutableData<T>();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t pad = static_cast<int64_t>(padding * static_cast<double>(length) * static_cast<double>(rows - r) /
                                       static_cast<double>(rows));
    pad = std::min(pad, length - 1);
    const int64_t start = left_on_even_rows && r % 2 == 0 ? 0 : length - pad;
    for (int64_t i = start; i < start + pad; ++i) data[r * length + i] = T(0);
  }
  return true;
}

// A supplied tensor for `name`, checked against what the session expects.
absl::StatusOr<Ort::Value> SuppliedValue(const std::string& name, const onnx::TensorProto& tensor,
                                         const Ort::ConstTensorTypeAndShapeInfo& expected) {
  if (static_cast<int>(tensor.data_type()) != static_cast<int>(expected.GetElementType())) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_MISMATCH,
                   absl::StrCat("supplied input '", name, "' has element type ", tensor.data_type(),
                                ", the model wants ", static_cast<int>(expected.GetElementType())));
  }
  const std::vector<int64_t> want = expected.GetShape();
  bool fits = static_cast<size_t>(tensor.dims_size()) == want.size();
  for (size_t d = 0; fits && d < want.size(); ++d) fits = want[d] < 0 || want[d] == tensor.dims(static_cast<int>(d));
  if (!fits) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_MISMATCH,
                   absl::StrCat("supplied input '", name, "' has shape ", absl::StrJoin(tensor.dims(), "x"),
                                ", the model wants ", absl::StrJoin(want, "x"), " (-1: any)"));
  }
  absl::StatusOr<Ort::Value> value = TensorProtoToOrtValue(tensor);
  if (!value.ok()) {
    return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_INVALID,
                   absl::StrCat("supplied input '", name, "': ", value.status().message()));
  }
  return value;
}

}  // namespace

std::vector<DimValues> ShapeSets(const v1::ValidationConfig& config) {
  const DimValues base(config.dim_values().begin(), config.dim_values().end());
  if (config.shapes_size() == 0) return {base};
  std::vector<DimValues> sets;
  for (const auto& shape_set : config.shapes()) {
    DimValues dims = base;
    for (const auto& [name, value] : shape_set.dim_values()) dims[name] = value;
    sets.push_back(std::move(dims));
  }
  return sets;
}

std::vector<DimValues> InputShapeSets(const v1::ValidationConfig& config, bool supplied,
                                      const onnx::ModelProto& model) {
  std::vector<DimValues> sets = ShapeSets(config);
  if (supplied) sets.resize(1);
  if (supplied || config.shapes_size() > 0) return sets;
  const std::optional<CacheInterface> cache = FindCacheInterface(model.graph());
  if (!cache) return sets;
  // The phases fix their own dim (dim_values give the rest): a one-token step after a past is what ONNX
  // Runtime's GroupQueryAttention takes at any batch size, a chunk after a past only at batch 1.
  DimValues prefill = sets.front(), decode = sets.front();
  prefill[cache->past_dim] = 0;
  decode[cache->new_dim] = 1;
  return {prefill, decode};
}

std::vector<DimValues> ParityShapeSets(const v1::ValidationConfig& config, bool supplied,
                                       const onnx::ModelProto& model) {
  std::vector<DimValues> sets = InputShapeSets(config, supplied, model);
  if (supplied || config.shapes_size() > 0) return sets;
  const std::optional<CacheInterface> cache = FindCacheInterface(model.graph());
  if (!cache || cache->batch_dim.empty() || sets.size() != 2) return sets;
  DimValues chunk = sets.back();  // the decode step's past
  chunk[cache->new_dim] = 4;
  chunk[cache->batch_dim] = 1;
  sets.push_back(std::move(chunk));
  return sets;
}

std::vector<std::string> OutputNames(Ort::Session& session) {
  std::vector<std::string> names;
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session.GetOutputCount(); ++i) names.push_back(session.GetOutputNameAllocated(i, allocator).get());
  return names;
}

GeneratedInputs InputViews(const GeneratedInputs& inputs) {
  GeneratedInputs views;
  views.shapes = inputs.shapes;
  views.padded_masks = inputs.padded_masks;
  for (size_t i = 0; i < inputs.names.size(); ++i) {
    const Ort::Value& value = inputs.values[i];
    const auto info = value.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    views.names.push_back(inputs.names[i]);
    views.values.push_back(Ort::Value::CreateTensor(value.GetTensorMemoryInfo(),
                                                    const_cast<void*>(value.GetTensorRawData()),
                                                    value.GetTensorSizeInBytes(), shape.data(), shape.size(),
                                                    info.GetElementType()));
  }
  return views;
}

absl::StatusOr<std::vector<Ort::Value>> RunOnInputs(Ort::Session& session, const GeneratedInputs& inputs,
                                                    const std::vector<std::string>& output_names,
                                                    const Ort::RunOptions* run_options) {
  std::vector<const char*> input_pointers, output_pointers;
  for (const auto& name : inputs.names) input_pointers.push_back(name.c_str());
  for (const auto& name : output_names) output_pointers.push_back(name.c_str());
  try {
    const Ort::RunOptions none{nullptr};
    return session.Run(run_options != nullptr ? *run_options : none, input_pointers.data(), inputs.values.data(), inputs.values.size(),
                       output_pointers.data(), output_pointers.size());
  } catch (const Ort::Exception& e) {
    return absl::InternalError(e.what());
  }
}

absl::StatusOr<std::vector<SuppliedSample>> LoadSuppliedInputs(
    const std::vector<std::map<std::string, std::filesystem::path>>& files) {
  std::vector<SuppliedSample> samples;
  for (const auto& set : files) {
    SuppliedSample sample;
    for (const auto& [name, path] : set) {
      absl::StatusOr<std::string> bytes = ReadFile(path);
      if (!bytes.ok()) return bytes.status();
      onnx::TensorProto tensor;
      if (!tensor.ParseFromString(*bytes) || tensor.data_location() == onnx::TensorProto::EXTERNAL) {
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_INVALID,
                       absl::StrCat("the file supplied for input '", name,
                                    "' is not a serialized ONNX TensorProto with its data"));
      }
      sample[name] = std::move(tensor);
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

int64_t DynamicDimValue(const std::string& dim_name, int position, const DimValues& dims) {
  auto it = dims.find(dim_name);
  if (it != dims.end()) return it->second;
  if (position == 0 || absl::StrContains(absl::AsciiStrToLower(dim_name), "batch")) return 1;
  return 16;
}

absl::StatusOr<GeneratedInputs> GenerateInputs(Ort::Session& session, const onnx::ModelProto& model,
                                               const v1::ValidationConfig& config, int sample) {
  return GenerateInputs(session, model, config, ShapeSets(config).front(), sample);
}

absl::StatusOr<GeneratedInputs> GenerateInputs(Ort::Session& session, const onnx::ModelProto& model,
                                               const v1::ValidationConfig& config, const DimValues& dims, int sample,
                                               const SuppliedSample* supplied) {
  GeneratedInputs inputs;
  if (supplied != nullptr) {
    std::set<std::string> known;
    Ort::AllocatorWithDefaultOptions allocator;
    for (size_t i = 0; i < session.GetInputCount(); ++i) known.insert(session.GetInputNameAllocated(i, allocator).get());
    for (const auto& entry : *supplied) {
      if (known.count(entry.first) == 0) {
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_MISMATCH,
                       absl::StrCat("the model has no input '", entry.first, "'"));
      }
    }
  }
  std::mt19937_64 random(config.seed() * 1000003 + static_cast<uint64_t>(sample));
  // A key/value cache: the total length is the past plus the new tokens unless the config says.
  const std::optional<CacheInterface> cache = FindCacheInterface(model.graph());
  DimValues resolved = dims;
  if (cache && !cache->total_dim.empty() && dims.count(cache->total_dim) == 0) {
    resolved[cache->total_dim] = DynamicDimValue(cache->past_dim, 1, dims) + DynamicDimValue(cache->new_dim, 1, dims);
  }
  const bool left_padding = cache.has_value();
  InitializerIndex initializers;
  IndexInitializers(model.graph(), &initializers);
  const std::vector<const onnx::NodeProto*> nodes = AllNodes(model.graph());
  try {
    Ort::AllocatorWithDefaultOptions allocator;
    for (size_t i = 0; i < session.GetInputCount(); ++i) {
      const std::string name = session.GetInputNameAllocated(i, allocator).get();
      Ort::TypeInfo type_info = session.GetInputTypeInfo(i);
      if (type_info.GetONNXType() != ONNX_TYPE_TENSOR) {
        return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_UNSUPPORTED,
                       absl::StrCat("input '", name, "' is not a tensor; supply inputs with the job"));
      }
      auto tensor_info = type_info.GetTensorTypeAndShapeInfo();
      if (supplied != nullptr && supplied->count(name) > 0) {
        const onnx::TensorProto& tensor = supplied->at(name);
        absl::StatusOr<Ort::Value> value = SuppliedValue(name, tensor, tensor_info);
        if (!value.ok()) return value.status();
        inputs.shapes[name] = absl::StrJoin(tensor.dims(), "x");
        inputs.names.push_back(name);
        inputs.values.push_back(*std::move(value));
        continue;
      }
      std::vector<int64_t> shape = tensor_info.GetShape();
      std::vector<const char*> symbolic(shape.size(), nullptr);
      tensor_info.GetSymbolicDimensions(symbolic.data(), symbolic.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] < 0) shape[d] = DynamicDimValue(symbolic[d] ? symbolic[d] : "", static_cast<int>(d), resolved);
      }
      const std::string lower = absl::AsciiStrToLower(name);
      const bool is_mask = absl::StrContains(lower, "mask");
      const int64_t rows = IndexedTableRows(nodes, initializers, name);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      // Position ids that index no table (rotary embeddings compute from them) count along each row,
      // row r in steps of r + 1: the rows differ by more than a shift, which rotary attention cannot
      // see (its scores depend on position differences), and no row is all zeros (no rotation).
      // Position ids that index a table cut to the sequence at run time count 0..S-1 on every row.
      const bool is_position = rows == 0 && !is_mask && absl::StrContains(lower, "position") && !shape.empty();
      const bool within_sequence = is_position && IndexesComputedTable(nodes, initializers, name);
      const int64_t row_length = shape.empty() ? 1 : std::max<int64_t>(shape.back(), 1);
      int64_t element = 0;
      auto integer = [&]() -> int64_t {
        if (rows > 0) return std::uniform_int_distribution<int64_t>(0, rows - 1)(random);
        if (is_position) {
          const int64_t i = element++;
          return within_sequence ? i % row_length : (i % row_length) * (i / row_length + 1);
        }
        return is_mask ? 1 : 0;
      };
      Ort::Value value(nullptr);
      bool padded = false;
      switch (tensor_info.GetElementType()) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
          value = is_mask ? MakeTensor<float>(shape, [] { return 1.0f; })
                          : MakeTensor<float>(shape, [&] { return normal(random); });
          if (is_mask) padded = PadMask<float>(value, shape, MaskPadding(config), left_padding);
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
          value = MakeTensor<double>(shape, [&] { return static_cast<double>(normal(random)); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
          value = MakeTensor<Ort::Float16_t>(shape, [&] { return Ort::Float16_t(normal(random)); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
          value = MakeTensor<int64_t>(shape, integer);
          if (is_mask) padded = PadMask<int64_t>(value, shape, MaskPadding(config), left_padding);
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
          value = MakeTensor<int32_t>(shape, [&] { return static_cast<int32_t>(integer()); });
          if (is_mask) padded = PadMask<int32_t>(value, shape, MaskPadding(config), left_padding);
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
          value = MakeTensor<uint8_t>(shape, [&] { return static_cast<uint8_t>(integer()); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
          value = MakeTensor<int8_t>(shape, [&] { return static_cast<int8_t>(integer()); });
          break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
          if (cache && name == cache->use_cache_input) {  // the merged decoder's branch with a past, if any
            const bool use_cache = DynamicDimValue(cache->past_dim, 1, resolved) > 0;
            value = MakeTensor<bool>(shape, [use_cache] { return use_cache; });
            break;
          }
          value = MakeTensor<bool>(shape, [] { return true; });
          if (is_mask) padded = PadMask<bool>(value, shape, MaskPadding(config), left_padding);
          break;
        default:
          return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::INPUT_UNSUPPORTED,
                         absl::StrCat("input '", name, "' has element type ", tensor_info.GetElementType(),
                                      " which onnxopt cannot generate; supply inputs with the job"));
      }
      inputs.shapes[name] = absl::StrJoin(shape, "x");
      if (padded) inputs.padded_masks.push_back(name);
      inputs.names.push_back(name);
      inputs.values.push_back(std::move(value));
    }
  } catch (const Ort::Exception& e) {
    return absl::InternalError(absl::StrCat("generating inputs: ", e.what()));
  }
  return inputs;
}

}  // namespace onnxopt
