#include "client/genai_config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/deploy_settings.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "optimizer/cache_interface.h"
#include "optimizer/failure.h"
#include "optimizer/model_io.h"
#include "optimizer/result_files.h"

namespace onnxopt::client {
namespace fs = std::filesystem;
using google::protobuf::Struct;
using google::protobuf::Value;

namespace {

// The model types ONNX Runtime GenAI drives as decoder-only language models (src/models/model_type.h,
// ModelType::IsLLM); "decoder" is its name for any other such model.
const std::set<std::string>& GenaiDecoderTypes() {
  static const auto* types = new std::set<std::string>{
      "chatglm", "decoder", "ernie4_5", "gemma", "gemma2", "gemma3_text", "gemma4_text", "gpt2", "gptoss",
      "granite", "granitemoehybrid", "hunyuandensev1", "internlm2", "lfm2", "llama", "mistral", "nemotron", "olmo",
      "phi", "phimoe", "phi3", "phi3small", "qwen2", "qwen3", "qwen3_5_moe_text", "qwen3_5_text", "smollm3"};
  return *types;
}

// What GenAI's tokenizer (onnxruntime-extensions) reads from a Hugging Face folder.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json",
                                           "added_tokens.json", "tokenizer.model",     "vocab.json",
                                           "merges.txt",        "vocab.txt",           "spiece.model",
                                           "chat_template.jinja"};

absl::Status Unsupported(const std::string& why) {
  return Failure(absl::StatusCode::kFailedPrecondition, v1::ErrorReason::GENAI_UNSUPPORTED, why);
}

// ---- JSON out: keys sorted, integers as integers, two-space indents -------------------------------

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

void AppendJson(std::string* out, const Value& value, int indent) {
  const std::string pad(indent + 2, ' ');
  switch (value.kind_case()) {
    case Value::kNumberValue: {
      const double number = value.number_value();
      if (std::floor(number) == number && std::fabs(number) < 9.0e15) {
        absl::StrAppend(out, static_cast<int64_t>(number));
      } else {
        absl::StrAppend(out, absl::StrFormat("%.17g", number));
      }
      break;
    }
    case Value::kStringValue: absl::StrAppend(out, JsonString(value.string_value())); break;
    case Value::kBoolValue: absl::StrAppend(out, value.bool_value() ? "true" : "false"); break;
    case Value::kStructValue: {
      std::map<std::string, const Value*> sorted;
      for (const auto& [key, field] : value.struct_value().fields()) sorted[key] = &field;
      if (sorted.empty()) {
        absl::StrAppend(out, "{}");
        break;
      }
      absl::StrAppend(out, "{\n");
      size_t i = 0;
      for (const auto& [key, field] : sorted) {
        absl::StrAppend(out, pad, JsonString(key), ": ");
        AppendJson(out, *field, indent + 2);
        absl::StrAppend(out, ++i < sorted.size() ? ",\n" : "\n");
      }
      absl::StrAppend(out, std::string(indent, ' '), "}");
      break;
    }
    case Value::kListValue: {
      const auto& items = value.list_value().values();
      if (items.empty()) {
        absl::StrAppend(out, "[]");
        break;
      }
      absl::StrAppend(out, "[\n");
      for (int i = 0; i < items.size(); ++i) {
        absl::StrAppend(out, pad);
        AppendJson(out, items[i], indent + 2);
        absl::StrAppend(out, i + 1 < items.size() ? ",\n" : "\n");
      }
      absl::StrAppend(out, std::string(indent, ' '), "]");
      break;
    }
    default: absl::StrAppend(out, "null");
  }
}

Value JsonNumber(double number) {
  Value value;
  value.set_number_value(number);
  return value;
}
Value Text(const std::string& text) {
  Value value;
  value.set_string_value(text);
  return value;
}
Value Flag(bool flag) {
  Value value;
  value.set_bool_value(flag);
  return value;
}
Value& Field(Struct* object, const std::string& key) { return (*object->mutable_fields())[key]; }
Struct* Object(Struct* parent, const std::string& key) { return Field(parent, key).mutable_struct_value(); }

// ---- What the Hugging Face files say -------------------------------------------------------------

// config.json and generation_config.json of the tokenizer folder (empty objects where absent).
struct HfFiles {
  Struct config, generation;
};

absl::StatusOr<Struct> ReadJsonObject(const fs::path& path) {
  Struct object;
  std::error_code error;
  if (!fs::exists(path, error)) return object;
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &object, options).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not a JSON object"));
  }
  return object;
}

std::optional<double> NumberIn(const Struct& object, const std::string& key) {
  auto it = object.fields().find(key);
  if (it == object.fields().end() || it->second.kind_case() != Value::kNumberValue) return std::nullopt;
  return it->second.number_value();
}

// A number from generation_config.json, else from config.json, with which file it came from.
std::optional<std::pair<double, std::string>> Setting(const HfFiles& hf, const std::string& key) {
  if (auto number = NumberIn(hf.generation, key)) return std::make_pair(*number, "generation_config.json");
  if (auto number = NumberIn(hf.config, key)) return std::make_pair(*number, "config.json");
  return std::nullopt;
}

// eos_token_id: a number or a list of numbers, generation_config.json's first.
std::optional<std::pair<Value, std::string>> EosIds(const HfFiles& hf) {
  for (const auto& [object, file] : {std::pair(&hf.generation, "generation_config.json"),
                                     std::pair(&hf.config, "config.json")}) {
    auto it = object->fields().find("eos_token_id");
    if (it == object->fields().end()) continue;
    if (it->second.kind_case() == Value::kNumberValue) return std::make_pair(it->second, std::string(file));
    if (it->second.kind_case() == Value::kListValue && it->second.list_value().values_size() > 0) {
      return std::make_pair(it->second, std::string(file));
    }
  }
  return std::nullopt;
}

// ---- What the graph says -------------------------------------------------------------------------

const onnx::TensorShapeProto* ShapeOf(const onnx::ValueInfoProto& value) {
  return value.type().has_tensor_type() && value.type().tensor_type().has_shape() ? &value.type().tensor_type().shape()
                                                                                  : nullptr;
}

std::optional<int64_t> StaticDim(const onnx::ValueInfoProto& value, int axis) {
  const onnx::TensorShapeProto* shape = ShapeOf(value);
  if (shape == nullptr || axis >= shape->dim_size() || !shape->dim(axis).has_dim_value()) return std::nullopt;
  return shape->dim(axis).dim_value();
}

// One name per layer and kind (key, value) of the cache, written by GenAI as printf patterns over the
// layer index: "past_key_values.%d.key". Found by replacing one run of digits in every name with %d;
// the two patterns that result must each hold layers 0..L-1 exactly as %d writes them (no zero
// padding) and differ where one says k(ey) and the other v(alue).
struct LayerPatterns {
  std::string keys, values;
  int layers = 0;
};

std::vector<std::pair<size_t, size_t>> DigitRuns(const std::string& name) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < name.size();) {
    if (!absl::ascii_isdigit(name[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < name.size() && absl::ascii_isdigit(name[end])) ++end;
    runs.push_back({i, end - i});
    i = end;
  }
  return runs;
}

std::string Written(const std::string& pattern, int layer) {
  return absl::StrReplaceAll(pattern, {{"%d", absl::StrCat(layer)}});
}

std::optional<LayerPatterns> FindLayerPatterns(const std::vector<std::string>& names) {
  if (names.empty() || names.size() % 2 != 0) return std::nullopt;
  for (const std::string& name : names) {
    if (absl::StrContains(name, "%")) return std::nullopt;
  }
  const int layers = static_cast<int>(names.size() / 2);
  for (size_t run = 0;; ++run) {
    std::map<std::string, std::set<std::string>> by_pattern;  // pattern -> names
    for (const std::string& name : names) {
      const auto runs = DigitRuns(name);
      if (run >= runs.size()) return std::nullopt;
      by_pattern[absl::StrCat(name.substr(0, runs[run].first), "%d", name.substr(runs[run].first + runs[run].second))]
          .insert(name);
    }
    if (by_pattern.size() != 2) continue;
    const auto complete = [&](const std::string& pattern, const std::set<std::string>& written) {
      if (static_cast<int>(written.size()) != layers) return false;
      for (int layer = 0; layer < layers; ++layer) {
        if (written.count(Written(pattern, layer)) == 0) return false;
      }
      return true;
    };
    const auto& [first, first_names] = *by_pattern.begin();
    const auto& [second, second_names] = *by_pattern.rbegin();
    if (!complete(first, first_names) || !complete(second, second_names)) continue;
    // Where the two patterns differ: "key" against "value", "k" against "v".
    size_t prefix = 0;
    while (prefix < first.size() && prefix < second.size() && first[prefix] == second[prefix]) ++prefix;
    if (prefix == first.size() || prefix == second.size()) return std::nullopt;
    const char a = absl::ascii_tolower(first[prefix]);
    const char b = absl::ascii_tolower(second[prefix]);
    if (a == 'k' && b == 'v') return LayerPatterns{first, second, layers};
    if (a == 'v' && b == 'k') return LayerPatterns{second, first, layers};
    return std::nullopt;
  }
}

const onnx::TensorProto* Initializer(const onnx::GraphProto& graph, const std::string& name) {
  for (const auto& tensor : graph.initializer()) {
    if (tensor.name() == name) return &tensor;
  }
  return nullptr;
}

// The embedding table [V, H] the token ids are gathered from (float, or int8 rows dequantized after).
const onnx::TensorProto* EmbeddingTable(const onnx::GraphProto& graph, const std::string& ids) {
  for (const auto& node : graph.node()) {
    if (node.op_type() != "Gather" || !node.domain().empty() || node.input_size() < 2 || node.input(1) != ids) continue;
    const onnx::TensorProto* table = Initializer(graph, node.input(0));
    if (table != nullptr && table->dims_size() == 2) return table;
  }
  return nullptr;
}

// The query heads of the fused attention (every layer's is the same in the decoders GenAI drives).
std::optional<int64_t> FusedQueryHeads(const onnx::GraphProto& graph) {
  for (const auto& node : graph.node()) {
    if (node.domain() != "com.microsoft") continue;
    if (node.op_type() != "GroupQueryAttention" && node.op_type() != "MultiHeadAttention" &&
        node.op_type() != "Attention") {
      continue;
    }
    for (const auto& attribute : node.attribute()) {
      if (attribute.name() == "num_heads" && attribute.i() > 0) return attribute.i();
    }
  }
  return std::nullopt;
}

// The rows of a rotary cache stored in the model: the positions it can rotate.
std::optional<int64_t> StoredRotaryPositions(const onnx::GraphProto& graph) {
  for (const auto& node : graph.node()) {
    if (node.domain() != "com.microsoft") continue;
    int cos_input = -1;
    if (node.op_type() == "RotaryEmbedding") cos_input = 2;
    if (node.op_type() == "GroupQueryAttention") cos_input = 7;
    if (cos_input < 0 || node.input_size() <= cos_input) continue;
    const onnx::TensorProto* cache = Initializer(graph, node.input(cos_input));
    if (cache != nullptr && cache->dims_size() == 2) return cache->dims(0);
  }
  return std::nullopt;
}

bool IsIntegerInput(const onnx::ValueInfoProto& value) {
  const int type = value.type().tensor_type().elem_type();
  return type == onnx::TensorProto::INT64 || type == onnx::TensorProto::INT32;
}

// The checked shape of the cache: every past [B, N_kv, P, D] of one float type, N_kv and D the same
// in every layer (from the graph, else config.json).
struct CacheShape {
  int64_t kv_heads = 0, head_size = 0;
};

absl::StatusOr<CacheShape> CacheShapeOf(const onnx::GraphProto& graph, const CacheInterface& cache, const HfFiles& hf,
                                        std::vector<std::string>* notes) {
  std::map<std::string, const onnx::ValueInfoProto*> inputs;
  for (const auto& input : graph.input()) inputs[input.name()] = &input;
  CacheShape shape;
  for (const auto& entry : cache.entries) {
    const onnx::ValueInfoProto& past = *inputs.at(entry.past);
    const onnx::TensorShapeProto* dims = ShapeOf(past);
    const int type = past.type().tensor_type().elem_type();
    if (dims == nullptr || dims->dim_size() != 4 || entry.axis != 2) {
      return Unsupported(absl::StrCat(
          "'", entry.past, "' is no [batch, kv_heads, past_sequence, head_size] tensor; GenAI's cache is laid out so"));
    }
    if (type != onnx::TensorProto::FLOAT && type != onnx::TensorProto::FLOAT16) {
      return Unsupported(
          absl::StrCat("'", entry.past, "' is neither float nor float16; GenAI's cache is one of those"));
    }
    for (auto [axis, field] : {std::pair(1, &shape.kv_heads), std::pair(3, &shape.head_size)}) {
      const std::optional<int64_t> dim = StaticDim(past, axis);
      if (!dim) continue;
      if (*field != 0 && *field != *dim) {
        return Unsupported(absl::StrCat("the cache's layers differ in shape ('", entry.past, "'); GenAI's have one"));
      }
      *field = *dim;
    }
  }
  if (shape.kv_heads == 0) {
    if (auto heads = NumberIn(hf.config, "num_key_value_heads")) {
      shape.kv_heads = static_cast<int64_t>(*heads);
      notes->push_back("num_key_value_heads from config.json (the past tensors name it symbolically)");
    }
  }
  if (shape.head_size == 0) {
    if (auto head = NumberIn(hf.config, "head_dim")) {
      shape.head_size = static_cast<int64_t>(*head);
      notes->push_back("head_size from config.json's head_dim (the past tensors name it symbolically)");
    }
  }
  if (shape.kv_heads <= 0 || shape.head_size <= 0) {
    return Unsupported(
        "the past tensors' heads and head size are symbolic and no config.json beside the tokenizer says them");
  }
  return shape;
}

// GenAI feeds the token ids, the mask, the positions and the cache, and nothing else.
absl::Status CheckFedInputs(const onnx::GraphProto& graph, const CacheInterface& cache) {
  std::set<std::string> fed = {cache.ids_input, cache.mask_input, cache.position_input};
  for (const auto& entry : cache.entries) fed.insert(entry.past);
  std::set<std::string> initializers;
  for (const auto& tensor : graph.initializer()) initializers.insert(tensor.name());
  for (const auto& input : graph.input()) {
    if (initializers.count(input.name()) > 0 || fed.count(input.name()) > 0) continue;
    return Unsupported(absl::StrCat("input '", input.name(),
                                    "' is none GenAI feeds (it feeds token ids, attention_mask, position_ids and the "
                                    "key/value cache)"));
  }
  for (const auto& input : graph.input()) {
    const bool index_input = input.name() == cache.ids_input || input.name() == cache.mask_input ||
                             input.name() == cache.position_input;
    if (index_input && !IsIntegerInput(input)) {
      return Unsupported(absl::StrCat("'", input.name(), "' is neither int64 nor int32, as GenAI feeds it"));
    }
  }
  return absl::OkStatus();
}

// ORT session options as the job's benchmark measured them (as Triton's config.pbtxt gets them).
Struct SessionOptions(const v1::Report& report) {
  const DeploySettings deploy = DeploySettingsOf(report.benchmark());
  Struct options;
  Field(&options, "log_id") = Text("onnxruntime-genai");
  Value& providers = Field(&options, "provider_options");
  providers.mutable_list_value();
  if (deploy.gpu) {
    Struct cuda;
    for (const auto& [key, value] : deploy.cuda_options) Field(&cuda, key) = Text(value);
    Struct entry;
    *Field(&entry, "cuda").mutable_struct_value() = cuda;
    *providers.mutable_list_value()->add_values()->mutable_struct_value() = entry;
  }
  if (deploy.measured) {
    if (deploy.intra_op_threads > 0) Field(&options, "intra_op_num_threads") = JsonNumber(deploy.intra_op_threads);
    static const auto* levels = new std::map<std::string, std::string>{
        {"basic", "ORT_ENABLE_BASIC"}, {"extended", "ORT_ENABLE_EXTENDED"}, {"disabled", "ORT_DISABLE_ALL"},
        {"none", "ORT_DISABLE_ALL"}};
    auto it = levels->find(deploy.optimization_level);
    if (it != levels->end()) Field(&options, "graph_optimization_level") = Text(it->second);
  }
  return options;
}

absl::StatusOr<int64_t> ContextLength(const onnx::GraphProto& graph, const GenaiOptions& options, const HfFiles& hf,
                                      std::vector<std::string>* notes) {
  if (options.context_length > 0) return options.context_length;
  for (const char* key : {"max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"}) {
    if (auto length = NumberIn(hf.config, key); length && *length > 0) {
      notes->push_back(absl::StrCat("context_length ", static_cast<int64_t>(*length), " from config.json's ", key));
      return static_cast<int64_t>(*length);
    }
  }
  if (auto rows = StoredRotaryPositions(graph)) {
    notes->push_back(absl::StrCat("context_length ", *rows, ": the rows of the rotary cache stored in the model"));
    return *rows;
  }
  return Failure(absl::StatusCode::kInvalidArgument, v1::ErrorReason::GENAI_CONTEXT_LENGTH,
                 "nothing says how many positions the model takes (no config.json with "
                 "max_position_embeddings beside the tokenizer, no stored rotary table): pass --context-length N");
}

// model.type: the flag, else config.json's model_type where GenAI knows it, else "decoder".
std::string ModelType(const GenaiOptions& options, const HfFiles& hf, std::vector<std::string>* notes) {
  if (!options.model_type.empty()) return options.model_type;
  auto it = hf.config.fields().find("model_type");
  if (it != hf.config.fields().end() && it->second.kind_case() == Value::kStringValue) {
    std::string type = absl::StrReplaceAll(it->second.string_value(), {{"gpt_oss", "gptoss"}});
    if (GenaiDecoderTypes().count(type) > 0) return type;
    notes->push_back(absl::StrCat("type \"decoder\": config.json's model_type \"", it->second.string_value(),
                                  "\" is none GenAI names"));
    return "decoder";
  }
  return "decoder";
}

// bos/eos/pad token ids from generation_config.json, else config.json; pad falls back to the first
// eos (as GenAI's model builder does). Ids nothing says are left out, and noted.
void TokenIds(const HfFiles& hf, Struct* model, std::vector<std::string>* notes) {
  if (auto bos = Setting(hf, "bos_token_id")) {
    Field(model, "bos_token_id") = JsonNumber(bos->first);
  } else {
    notes->push_back("bos_token_id left out: no config.json or generation_config.json names it");
  }
  std::optional<double> first_eos;
  if (auto eos = EosIds(hf)) {
    Field(model, "eos_token_id") = eos->first;
    first_eos = eos->first.kind_case() == Value::kNumberValue ? eos->first.number_value()
                                                              : eos->first.list_value().values(0).number_value();
  } else {
    notes->push_back("eos_token_id left out: generation stops at search.max_length only");
  }
  if (auto pad = Setting(hf, "pad_token_id")) {
    Field(model, "pad_token_id") = JsonNumber(pad->first);
  } else if (first_eos) {
    Field(model, "pad_token_id") = JsonNumber(*first_eos);
    notes->push_back("pad_token_id: the first eos_token_id (nothing names a pad token)");
  }
}

// search: greedy unless generation_config.json samples; max_length the context length; the cache
// not shared between past and present (the graph's presents are past + new, not a preallocated buffer).
Struct Search(const HfFiles& hf, int64_t context_length) {
  Struct search;
  auto sample = hf.generation.fields().find("do_sample");
  Field(&search, "do_sample") =
      Flag(sample != hf.generation.fields().end() && sample->second.kind_case() == Value::kBoolValue &&
           sample->second.bool_value());
  Field(&search, "max_length") = JsonNumber(static_cast<double>(context_length));
  Field(&search, "min_length") = JsonNumber(0);
  Field(&search, "num_beams") = JsonNumber(1);
  Field(&search, "num_return_sequences") = JsonNumber(1);
  Field(&search, "past_present_share_buffer") = Flag(false);
  for (const auto& [key, fallback] : {std::pair("repetition_penalty", 1.0), std::pair("temperature", 1.0),
                                      std::pair("top_k", 50.0), std::pair("top_p", 1.0)}) {
    const std::optional<double> value = NumberIn(hf.generation, key);
    Field(&search, key) = JsonNumber(value.value_or(fallback));
  }
  return search;
}

// The cache's past and present names as GenAI's printf patterns (past_key_values.%d.key).
struct CachePatterns {
  LayerPatterns past, present;
};

// The cache's patterns: one key and one value per layer numbered 0..L-1, each past fed back from the
// present of its layer and kind.
absl::StatusOr<CachePatterns> PairedCachePatterns(const CacheInterface& cache) {
  std::vector<std::string> pasts, presents;
  for (const auto& entry : cache.entries) {
    pasts.push_back(entry.past);
    presents.push_back(entry.present);
  }
  const std::optional<LayerPatterns> past = FindLayerPatterns(pasts);
  const std::optional<LayerPatterns> present = FindLayerPatterns(presents);
  if (!past || !present || past->layers != present->layers) {
    return Unsupported(absl::StrCat("the cache's names (", pasts.front(),
                                    ", ...) are not one key and one value per layer numbered 0..L-1, "
                                    "which GenAI's printf patterns (past_key_values.%d.key) need"));
  }
  for (int layer = 0; layer < past->layers; ++layer) {
    for (const auto& [from, to] : {std::pair(past->keys, present->keys), std::pair(past->values, present->values)}) {
      const std::string in = Written(from, layer), out = Written(to, layer);
      const bool paired = std::any_of(cache.entries.begin(), cache.entries.end(),
                                      [&](const auto& e) { return e.past == in && e.present == out; });
      if (!paired) {
        return Unsupported(absl::StrCat("'", in, "' is not fed back from '", out, "' as GenAI pairs them"));
      }
    }
  }
  return CachePatterns{*past, *present};
}

// num_attention_heads: the fused attention's, else config.json's, else left out (with a note).
void AddAttentionHeads(const onnx::GraphProto& graph, const Struct& config, Struct* decoder,
                       std::vector<std::string>* notes) {
  if (auto heads = FusedQueryHeads(graph)) {
    Field(decoder, "num_attention_heads") = JsonNumber(static_cast<double>(*heads));
  } else if (auto configured = NumberIn(config, "num_attention_heads")) {
    Field(decoder, "num_attention_heads") = JsonNumber(*configured);
    notes->push_back("num_attention_heads from config.json (no fused attention names it)");
  } else {
    notes->push_back(
        "num_attention_heads left out: no fused attention or config.json names it (GenAI reads "
        "it only where num_key_value_heads is missing)");
  }
}

// hidden_size: config.json's, else the embedding table's width, else left out (with a note).
void AddHiddenSize(const Struct& config, const onnx::TensorProto* table, Struct* decoder,
                   std::vector<std::string>* notes) {
  if (auto hidden = NumberIn(config, "hidden_size")) {
    Field(decoder, "hidden_size") = JsonNumber(*hidden);
  } else if (table != nullptr) {
    Field(decoder, "hidden_size") = JsonNumber(static_cast<double>(table->dims(1)));
  } else {
    notes->push_back("hidden_size left out: no embedding table or config.json names it");
  }
}

// The decoder's inputs and outputs by name, the cache's as patterns.
void AddDecoderNames(const CacheInterface& cache, const CachePatterns& patterns, Struct* decoder) {
  Struct* inputs = Object(decoder, "inputs");
  Field(inputs, "input_ids") = Text(cache.ids_input);
  if (!cache.mask_input.empty()) Field(inputs, "attention_mask") = Text(cache.mask_input);
  if (!cache.position_input.empty()) Field(inputs, "position_ids") = Text(cache.position_input);
  Field(inputs, "past_key_names") = Text(patterns.past.keys);
  Field(inputs, "past_value_names") = Text(patterns.past.values);
  Struct* outputs = Object(decoder, "outputs");
  Field(outputs, "logits") = Text(cache.logits_output);
  Field(outputs, "present_key_names") = Text(patterns.present.keys);
  Field(outputs, "present_value_names") = Text(patterns.present.values);
}

// The vocabulary's size as the graph says it: the logits' last dim, else the embedding table's rows.
std::optional<int64_t> GraphVocabSize(const onnx::GraphProto& graph, const std::string& logits_output,
                                      const onnx::TensorProto* table) {
  const onnx::ValueInfoProto* logits = nullptr;
  for (const auto& output : graph.output()) {
    if (output.name() == logits_output) logits = &output;
  }
  const onnx::TensorShapeProto* logits_shape = logits != nullptr ? ShapeOf(*logits) : nullptr;
  std::optional<int64_t> vocab;
  if (logits_shape != nullptr && logits_shape->dim_size() > 0) {
    vocab = StaticDim(*logits, logits_shape->dim_size() - 1);
  }
  if (!vocab && table != nullptr) vocab = table->dims(0);
  return vocab;
}

// vocab_size: the graph's, else config.json's (with a note); GENAI_UNSUPPORTED where neither says it.
absl::Status AddVocabSize(const onnx::GraphProto& graph, const std::string& logits_output,
                          const onnx::TensorProto* table, const Struct& config, Struct* model_json,
                          std::vector<std::string>* notes) {
  if (std::optional<int64_t> vocab = GraphVocabSize(graph, logits_output, table)) {
    Field(model_json, "vocab_size") = JsonNumber(static_cast<double>(*vocab));
  } else if (auto configured = NumberIn(config, "vocab_size")) {
    Field(model_json, "vocab_size") = JsonNumber(*configured);
    notes->push_back("vocab_size from config.json (the logits name it symbolically)");
  } else {
    return Unsupported("the vocabulary's size is symbolic in the logits and no config.json says it");
  }
  return absl::OkStatus();
}

absl::StatusOr<HfFiles> ReadHfFiles(const fs::path& folder) {
  HfFiles hf;
  if (folder.empty()) return hf;
  absl::StatusOr<Struct> config = ReadJsonObject(folder / "config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<Struct> generation = ReadJsonObject(folder / "generation_config.json");
  if (!generation.ok()) return generation.status();
  hf.config = *std::move(config);
  hf.generation = *std::move(generation);
  return hf;
}

}  // namespace

absl::Status CheckGenaiOptions(const GenaiOptions& options) {
  if (!options.model_type.empty() && GenaiDecoderTypes().count(options.model_type) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--genai-type ", options.model_type, ": use one of ",
                                                   absl::StrJoin(GenaiDecoderTypes(), ", ")));
  }
  if (options.context_length < 0) return absl::InvalidArgumentError("--context-length must be 1 or more");
  if (options.tokenizer_dir.empty()) return absl::OkStatus();
  std::error_code error;
  if (!fs::is_directory(options.tokenizer_dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat("--tokenizer ", options.tokenizer_dir.string(), " is no folder"));
  }
  for (const char* file : {"tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model"}) {
    if (fs::exists(options.tokenizer_dir / file, error)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--tokenizer ", options.tokenizer_dir.string(),
                                                 " holds no tokenizer (tokenizer.json, tokenizer.model, vocab.json or "
                                                 "spiece.model)"));
}

absl::Status CheckGenaiFolderFree(const fs::path& folder) {
  std::error_code error;
  if (!fs::exists(folder, error)) return absl::OkStatus();
  if (fs::is_directory(folder, error) && fs::is_empty(folder, error)) return absl::OkStatus();
  return Failure(absl::StatusCode::kAlreadyExists, v1::ErrorReason::GENAI_FOLDER_EXISTS,
                 absl::StrCat(folder.string(),
                              " exists and is not empty; a delivered model folder is never written "
                              "into: choose a new folder"));
}

absl::StatusOr<GenaiConfig> GenaiConfigFor(const onnx::ModelProto& model, const v1::Report& report,
                                           const GenaiOptions& options) {
  const onnx::GraphProto& graph = model.graph();
  const std::optional<CacheInterface> cache = FindCacheInterface(graph);
  if (!cache || cache->logits_output.empty()) {
    return Unsupported(
        "the model has no key/value cache (past inputs fed back from present outputs) and logits; GenAI drives "
        "decoders exported with one (transformers' use_cache, make_cache_decoder.py)");
  }
  if (absl::Status fed = CheckFedInputs(graph, *cache); !fed.ok()) return fed;
  absl::StatusOr<CachePatterns> patterns = PairedCachePatterns(*cache);
  if (!patterns.ok()) return patterns.status();
  absl::StatusOr<HfFiles> hf = ReadHfFiles(options.tokenizer_dir);
  if (!hf.ok()) return hf.status();
  GenaiConfig result;
  absl::StatusOr<CacheShape> shape = CacheShapeOf(graph, *cache, *hf, &result.notes);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<int64_t> context_length = ContextLength(graph, options, *hf, &result.notes);
  if (!context_length.ok()) return context_length.status();

  Struct root;
  Struct* model_json = Object(&root, "model");
  Field(model_json, "type") = Text(ModelType(options, *hf, &result.notes));
  Field(model_json, "context_length") = JsonNumber(static_cast<double>(*context_length));
  TokenIds(*hf, model_json, &result.notes);

  Struct* decoder = Object(model_json, "decoder");
  *Object(decoder, "session_options") = SessionOptions(report);
  Field(decoder, "filename") = Text(kModelFileName);  // WriteGenaiFolder places the model under it
  Field(decoder, "num_hidden_layers") = JsonNumber(patterns->past.layers);
  Field(decoder, "num_key_value_heads") = JsonNumber(static_cast<double>(shape->kv_heads));
  Field(decoder, "head_size") = JsonNumber(static_cast<double>(shape->head_size));
  AddAttentionHeads(graph, hf->config, decoder, &result.notes);
  const onnx::TensorProto* table = EmbeddingTable(graph, cache->ids_input);
  AddHiddenSize(hf->config, table, decoder, &result.notes);
  AddDecoderNames(*cache, *patterns, decoder);

  absl::Status vocab = AddVocabSize(graph, cache->logits_output, table, hf->config, model_json, &result.notes);
  if (!vocab.ok()) return vocab;
  *Object(&root, "search") = Search(*hf, *context_length);

  Value whole;
  *whole.mutable_struct_value() = std::move(root);
  AppendJson(&result.json, whole, 0);
  result.json.push_back('\n');
  return result;
}

absl::StatusOr<std::vector<fs::path>> WriteGenaiFolder(const std::vector<ResultFile>& files, const v1::Report& report,
                                                       const GenaiOptions& options, const fs::path& folder,
                                                       std::vector<std::string>* notes) {
  if (absl::Status valid = CheckGenaiOptions(options); !valid.ok()) return valid;
  const ResultFile* model_file = FindRole(files, v1::ARTIFACT_MODEL);
  if (model_file == nullptr) return absl::NotFoundError("the result has no model");
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(model_file->path);  // the graph: names, dims, attributes
  if (!model.ok()) return model.status();
  absl::StatusOr<GenaiConfig> config = GenaiConfigFor(*model, report, options);
  if (!config.ok()) return config.status();
  if (absl::Status free = CheckGenaiFolderFree(folder); !free.ok()) return free;

  std::error_code error;
  fs::path parent = fs::absolute(folder, error).lexically_normal().parent_path();
  if (folder.filename().empty()) parent = parent.parent_path();  // "out/" names "out"
  fs::create_directories(parent, error);
  const fs::path staging = parent / absl::StrCat(".onnxopt-genai-", ::getpid());
  fs::remove_all(staging, error);
  fs::create_directories(staging, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", staging.string(), ": ", error.message()));
  auto fail = [&](const std::string& why) {
    fs::remove_all(staging, error);
    return absl::InternalError(why);
  };
  for (const ResultFile& file : files) {
    const fs::path to = staging / (file.role == v1::ARTIFACT_REPORT  ? fs::path("onnxopt_report.json")
                                   : file.role == v1::ARTIFACT_MODEL ? fs::path(kModelFileName)
                                                                     : file.path.filename());
    fs::rename(file.path, to, error);
    if (error) return fail(absl::StrCat("cannot move ", file.path.string(), " into ", staging.string()));
  }
  for (const char* name : kTokenizerFiles) {
    const fs::path from = options.tokenizer_dir / name;
    if (options.tokenizer_dir.empty() || !fs::exists(from, error)) continue;
    fs::copy_file(from, staging / name, error);
    if (error) return fail(absl::StrCat("cannot copy ", from.string(), ": ", error.message()));
  }
  if (absl::Status written = WriteFileAtomically(staging / "genai_config.json", config->json); !written.ok()) {
    fs::remove_all(staging, error);
    return written;
  }
  fs::remove(folder, error);  // an empty folder gives way; a non-empty one was refused above
  fs::rename(staging, folder, error);
  if (error) return fail(absl::StrCat("cannot create ", folder.string(), ": ", error.message()));
  std::vector<fs::path> written;
  for (const auto& entry : fs::directory_iterator(folder, error)) written.push_back(entry.path());
  std::sort(written.begin(), written.end());
  if (notes != nullptr) *notes = std::move(config->notes);
  return written;
}

}  // namespace onnxopt::client
