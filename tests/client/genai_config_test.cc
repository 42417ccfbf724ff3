// ONNX Runtime GenAI's deliverable: genai_config.json parsed with protobuf's JSON parser into the
// project's declaration of GenAI's config keys (tests/client/genai_config.proto, from GenAI's own
// parser), which refuses any key GenAI does not know, plus a walk that checks each value's JSON type;
// the figures against the graph they come from; the refusals; the folder.
#include "client/genai_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/genai_config.pb.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"

namespace onnxopt::client {
namespace {

namespace fs = std::filesystem;
namespace genai = onnxopt::test::genai;
using google::protobuf::FieldDescriptor;

const fs::path kFixtures = fs::path(ONNXOPT_SOURCE_DIR) / "tests" / "fixtures" / "cache";

// Every JSON value has the type GenAI's parser reads it as: numbers for numeric fields, strings for
// string fields, booleans for booleans, objects for messages (Value and Struct fields are free).
void ExpectJsonTypes(const google::protobuf::Struct& json, const google::protobuf::Descriptor& schema,
                     const std::string& where) {
  for (const auto& [key, value] : json.fields()) {
    const FieldDescriptor* field = schema.FindFieldByName(key);
    ASSERT_NE(field, nullptr) << where << key << " is no key GenAI knows";
    const std::string at = absl::StrCat(where, key);
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_FLOAT:
        EXPECT_EQ(value.kind_case(), google::protobuf::Value::kNumberValue) << at << " must be a JSON number";
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        EXPECT_EQ(value.kind_case(), google::protobuf::Value::kStringValue) << at << " must be a JSON string";
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        EXPECT_EQ(value.kind_case(), google::protobuf::Value::kBoolValue) << at << " must be a JSON boolean";
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (field->message_type()->full_name().rfind("google.protobuf.", 0) == 0) break;
        ASSERT_EQ(value.kind_case(), google::protobuf::Value::kStructValue) << at << " must be a JSON object";
        ExpectJsonTypes(value.struct_value(), *field->message_type(), at + ".");
        break;
      default: ADD_FAILURE() << at << ": a type the schema does not use";
    }
  }
}

genai::GenaiConfig ParseAsGenai(const std::string& json) {
  genai::GenaiConfig config;
  google::protobuf::util::JsonParseOptions strict;  // unknown keys refused, as GenAI refuses them
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &config, strict).ok()) << json;
  google::protobuf::Struct raw;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &raw).ok()) << json;
  ExpectJsonTypes(raw, *genai::GenaiConfig::descriptor(), "");
  return config;
}

std::string Written(const std::string& pattern, int layer) {
  return absl::StrReplaceAll(pattern, {{"%d", absl::StrCat(layer)}});
}

v1::Report TunedCpuReport() {
  v1::Report report;
  v1::BenchmarkReport* benchmark = report.mutable_benchmark();
  benchmark->set_execution_provider("CPUExecutionProvider");
  benchmark->set_intra_op_threads(2);
  benchmark->set_ort_optimization_level("all");
  v1::TuningTrial* best = benchmark->mutable_tuning()->mutable_best();
  best->set_intra_op_threads(4);
  best->set_optimization_level("extended");
  best->set_p50_ms(1.5);
  return report;
}

onnx::ModelProto TrainedDecoder() {
  absl::StatusOr<onnx::ModelProto> model = ParseModelFile(kFixtures / "trained_decoder.onnx");
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : onnx::ModelProto();
}

GenaiOptions WithHfFiles() {
  GenaiOptions options;
  options.tokenizer_dir = kFixtures / "trained_decoder_hf";
  return options;
}

TEST(GenaiConfigTest, TheTrainedDecoderWithItsHuggingFaceFilesParsesAsGenaisSchema) {
  const onnx::ModelProto model = TrainedDecoder();
  absl::StatusOr<GenaiConfig> made = GenaiConfigFor(model, TunedCpuReport(), WithHfFiles());
  ASSERT_TRUE(made.ok()) << made.status();
  const genai::GenaiConfig config = ParseAsGenai(made->json);
  EXPECT_EQ(config.model().type(), "qwen2") << "config.json's model_type, one GenAI drives";
  EXPECT_EQ(config.model().context_length(), 64) << "config.json's max_position_embeddings";
  EXPECT_EQ(config.model().vocab_size(), 48) << "the logits' last dim";
  EXPECT_EQ(config.model().bos_token_id(), 0);
  EXPECT_EQ(config.model().eos_token_id().number_value(), 13) << "';' ends a line (generation_config.json)";
  EXPECT_EQ(config.model().pad_token_id(), 13) << "no pad token named: the first eos, as GenAI's builder does";
  const genai::Decoder& decoder = config.model().decoder();
  EXPECT_EQ(decoder.filename(), "model.onnx");
  EXPECT_EQ(decoder.num_hidden_layers(), 4);
  EXPECT_EQ(decoder.num_key_value_heads(), 2);
  EXPECT_EQ(decoder.head_size(), 32);
  EXPECT_EQ(decoder.hidden_size(), 128);
  EXPECT_EQ(decoder.num_attention_heads(), 4) << "the unfused original: from config.json";
  EXPECT_EQ(decoder.inputs().input_ids(), "input_ids");
  EXPECT_EQ(decoder.inputs().attention_mask(), "attention_mask");
  EXPECT_EQ(decoder.inputs().position_ids(), "") << "the model takes none: GenAI must not be told of one";
  EXPECT_EQ(decoder.inputs().past_key_names(), "past_key_values.%d.key");
  EXPECT_EQ(decoder.inputs().past_value_names(), "past_key_values.%d.value");
  EXPECT_EQ(decoder.outputs().logits(), "logits");
  EXPECT_EQ(decoder.outputs().present_key_names(), "present.%d.key");
  EXPECT_EQ(decoder.outputs().present_value_names(), "present.%d.value");
  // Every name the patterns write is one of the model's inputs or outputs, and every one is written.
  std::set<std::string> inputs, outputs, written_inputs, written_outputs;
  for (const auto& input : model.graph().input()) inputs.insert(input.name());
  for (const auto& output : model.graph().output()) outputs.insert(output.name());
  written_inputs = {decoder.inputs().input_ids(), decoder.inputs().attention_mask()};
  written_outputs = {decoder.outputs().logits()};
  for (int layer = 0; layer < decoder.num_hidden_layers(); ++layer) {
    written_inputs.insert(Written(decoder.inputs().past_key_names(), layer));
    written_inputs.insert(Written(decoder.inputs().past_value_names(), layer));
    written_outputs.insert(Written(decoder.outputs().present_key_names(), layer));
    written_outputs.insert(Written(decoder.outputs().present_value_names(), layer));
  }
  EXPECT_EQ(written_inputs, inputs);
  EXPECT_EQ(written_outputs, outputs);

  EXPECT_EQ(decoder.session_options().log_id(), "onnxruntime-genai");
  EXPECT_EQ(decoder.session_options().provider_options_size(), 0) << "the CPU: no provider to name";
  EXPECT_EQ(decoder.session_options().intra_op_num_threads(), 4) << "the tuning's best";
  EXPECT_EQ(decoder.session_options().graph_optimization_level(), "ORT_ENABLE_EXTENDED");
  EXPECT_EQ(config.search().max_length(), 64);
  EXPECT_FALSE(config.search().do_sample());
  EXPECT_FALSE(config.search().past_present_share_buffer()) << "presents are past + new, no shared buffer";
  EXPECT_EQ(config.search().num_beams(), 1);
  EXPECT_TRUE(absl::StrContains(made->json, "\"context_length\": 64,\n")) << "integers as integers: " << made->json;
  bool noted_pad = false;
  for (const std::string& note : made->notes) noted_pad |= absl::StrContains(note, "pad_token_id");
  EXPECT_TRUE(noted_pad) << "a figure nothing named is said to be inferred";
}

// A decoder spelled otherwise, with no Hugging Face files: everything from the graph, the context
// length from the rotary cache it stores, query heads from the fused attention, CUDA's settings.
onnx::ValueInfoProto Tensor(const std::string& name, int type, const std::vector<std::string>& dims) {
  onnx::ValueInfoProto value;
  value.set_name(name);
  auto* tensor = value.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(type);
  for (const std::string& dim : dims) {
    auto* d = tensor->mutable_shape()->add_dim();
    if (std::isdigit(static_cast<unsigned char>(dim[0]))) {
      d->set_dim_value(std::stoll(dim));
    } else {
      d->set_dim_param(dim);
    }
  }
  return value;
}

// Interface only (what the config reads): `layers` layers of cache named by `past(i, kind)` /
// `present(i, kind)`, a stored rotary cache of 4096 positions read by GroupQueryAttention.
template <typename Name>
onnx::ModelProto Decoder(int layers, Name past, Name present, int cache_type = onnx::TensorProto::FLOAT16) {
  onnx::ModelProto model;
  onnx::GraphProto* graph = model.mutable_graph();
  *graph->add_input() = Tensor("tokens", onnx::TensorProto::INT32, {"batch", "seq"});
  *graph->add_input() = Tensor("mask", onnx::TensorProto::INT32, {"batch", "total"});
  *graph->add_input() = Tensor("positions", onnx::TensorProto::INT64, {"batch", "seq"});
  *graph->add_output() = Tensor("scores", onnx::TensorProto::FLOAT, {"batch", "seq", "32000"});
  for (int i = 0; i < layers; ++i) {
    for (const char* kind : {"k", "v"}) {
      *graph->add_input() = Tensor(past(i, kind), cache_type, {"batch", "8", "past", "128"});
      *graph->add_output() = Tensor(present(i, kind), cache_type, {"batch", "8", "total", "128"});
    }
  }
  onnx::TensorProto* cos = graph->add_initializer();
  cos->set_name("cos_cache");
  cos->set_data_type(onnx::TensorProto::FLOAT16);
  cos->add_dims(4096);
  cos->add_dims(64);
  onnx::NodeProto* attention = graph->add_node();
  attention->set_op_type("GroupQueryAttention");
  attention->set_domain("com.microsoft");
  for (const char* input : {"q", "k", "v", "pk", "pv", "seqlens", "total", "cos_cache", "sin_cache"}) {
    attention->add_input(input);
  }
  onnx::AttributeProto* heads = attention->add_attribute();
  heads->set_name("num_heads");
  heads->set_type(onnx::AttributeProto::INT);
  heads->set_i(32);
  return model;
}

std::string CachePast(int layer, const char* kind) {
  return absl::StrCat("cache.layer", layer, ".past_", kind);
}
std::string CachePresent(int layer, const char* kind) {
  return absl::StrCat("cache.layer", layer, ".present_", kind);
}

TEST(GenaiConfigTest, AnotherSpellingIsReadFromTheGraphAlone) {
  v1::Report report;
  report.mutable_benchmark()->set_execution_provider("CUDAExecutionProvider");
  report.mutable_benchmark()->set_skipped(true);
  (*report.mutable_benchmark()->mutable_deploy_settings())["cuda.enable_cuda_graph"] = "1";
  absl::StatusOr<GenaiConfig> made = GenaiConfigFor(Decoder(32, CachePast, CachePresent), report, GenaiOptions());
  ASSERT_TRUE(made.ok()) << made.status();
  const genai::GenaiConfig config = ParseAsGenai(made->json);
  const genai::Decoder& decoder = config.model().decoder();
  EXPECT_EQ(config.model().type(), "decoder");
  EXPECT_EQ(config.model().context_length(), 4096) << "the stored rotary cache's rows";
  EXPECT_EQ(config.model().vocab_size(), 32000);
  EXPECT_EQ(decoder.num_hidden_layers(), 32);
  EXPECT_EQ(decoder.num_attention_heads(), 32) << "GroupQueryAttention's num_heads";
  EXPECT_EQ(decoder.num_key_value_heads(), 8);
  EXPECT_EQ(decoder.head_size(), 128);
  EXPECT_EQ(decoder.inputs().input_ids(), "tokens");
  EXPECT_EQ(decoder.inputs().attention_mask(), "mask");
  EXPECT_EQ(decoder.inputs().position_ids(), "positions");
  EXPECT_EQ(decoder.inputs().past_key_names(), "cache.layer%d.past_k");
  EXPECT_EQ(decoder.inputs().past_value_names(), "cache.layer%d.past_v");
  EXPECT_EQ(decoder.outputs().present_key_names(), "cache.layer%d.present_k");
  EXPECT_EQ(decoder.outputs().logits(), "scores");
  ASSERT_EQ(decoder.session_options().provider_options_size(), 1);
  const auto& cuda = decoder.session_options().provider_options(0).fields().at("cuda").struct_value();
  EXPECT_EQ(cuda.fields().at("enable_cuda_graph").string_value(), "1");
  EXPECT_EQ(decoder.session_options().intra_op_num_threads(), 0) << "nothing measured, nothing set";
  EXPECT_FALSE(made->json.find("bos_token_id") != std::string::npos) << "no file names it: left out";
  EXPECT_GE(made->notes.size(), 3u) << "context length, bos and eos are said";

  GenaiOptions typed;
  typed.model_type = "mistral";
  typed.context_length = 32768;
  made = GenaiConfigFor(Decoder(2, CachePast, CachePresent), report, typed);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(ParseAsGenai(made->json).model().type(), "mistral");
  EXPECT_EQ(ParseAsGenai(made->json).model().context_length(), 32768) << "the flag before the stored table";
}

TEST(GenaiConfigTest, RefusesWhatGenaiCannotDriveWithTheReason) {
  const v1::Report report;
  const GenaiOptions none;
  // No cache: an encoder.
  onnx::ModelProto encoder;
  *encoder.mutable_graph()->add_input() = Tensor("input_ids", onnx::TensorProto::INT64, {"batch", "seq"});
  *encoder.mutable_graph()->add_output() = Tensor("logits", onnx::TensorProto::FLOAT, {"batch", "2"});
  absl::StatusOr<GenaiConfig> made = GenaiConfigFor(encoder, report, none);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(made.status().message(), "GENAI_UNSUPPORTED")) << made.status();

  // An input GenAI does not feed.
  onnx::ModelProto extra = Decoder(2, CachePast, CachePresent);
  *extra.mutable_graph()->add_input() = Tensor("use_cache_branch", onnx::TensorProto::BOOL, {"1"});
  made = GenaiConfigFor(extra, report, none);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(made.status().message(), "'use_cache_branch'")) << made.status();

  // Layer numbers %d cannot write (zero-padded).
  auto padded_past = [](int layer, const char* kind) { return absl::StrCat("past_", kind, "_0", layer); };
  auto padded_present = [](int layer, const char* kind) { return absl::StrCat("present_", kind, "_0", layer); };
  made = GenaiConfigFor(Decoder(2, +padded_past, +padded_present), report, none);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(made.status().message(), "printf patterns")) << made.status();

  // A cache of another type.
  made = GenaiConfigFor(Decoder(2, CachePast, CachePresent, onnx::TensorProto::DOUBLE), report, none);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition);

  // Nothing says the context length: the trained decoder without its files.
  made = GenaiConfigFor(TrainedDecoder(), report, none);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(made.status().message(), "--context-length")) << made.status();
}

TEST(GenaiConfigTest, TheSchemaRefusesKeysGenaiDoesNotKnow) {
  genai::GenaiConfig config;
  google::protobuf::util::JsonParseOptions strict;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(R"({"model": {"context_length": 8}})", &config, strict).ok());
  EXPECT_FALSE(google::protobuf::util::JsonStringToMessage(R"({"model": {"max_position": 8}})", &config, strict).ok());
  EXPECT_FALSE(
      google::protobuf::util::JsonStringToMessage(R"({"model": {"decoder": {"layers": 2}}})", &config, strict).ok());
  EXPECT_FALSE(google::protobuf::util::JsonStringToMessage(R"({"generation": {}})", &config, strict).ok());
}

TEST(GenaiConfigTest, TheFlagsAreCheckedBeforeAnythingRuns) {
  GenaiOptions options;
  EXPECT_TRUE(CheckGenaiOptions(options).ok());
  options.model_type = "bert";
  EXPECT_EQ(CheckGenaiOptions(options).code(), absl::StatusCode::kInvalidArgument) << "no decoder GenAI drives";
  options.model_type = "qwen3";
  EXPECT_TRUE(CheckGenaiOptions(options).ok());
  options.tokenizer_dir = kFixtures;  // a folder, but no tokenizer in it
  EXPECT_EQ(CheckGenaiOptions(options).code(), absl::StatusCode::kInvalidArgument);
  options.tokenizer_dir = kFixtures / "trained_decoder_hf";
  EXPECT_TRUE(CheckGenaiOptions(options).ok());
  options.tokenizer_dir = kFixtures / "no_such_folder";
  EXPECT_EQ(CheckGenaiOptions(options).code(), absl::StatusCode::kInvalidArgument);
}

class GenaiFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("onnxopt-genai-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "download");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<fs::path> Download() {
    const fs::path folder = dir_ / "download";
    fs::copy_file(kFixtures / "trained_decoder.onnx", folder / "model.onnx", fs::copy_options::overwrite_existing);
    EXPECT_TRUE(WriteFileAtomically(folder / "report.json", "{}").ok());
    return {folder / "model.onnx", folder / "report.json"};
  }

  fs::path dir_;
};

TEST_F(GenaiFolderTest, WritesTheFolderGenaiLoadsWholeAndNeverIntoAFullOne) {
  const fs::path out = dir_ / "qwen-int4";
  std::vector<std::string> notes;
  absl::StatusOr<std::vector<fs::path>> written = WriteGenaiFolder(LocalResultFiles(Download()), TunedCpuReport(), WithHfFiles(), out, &notes);
  ASSERT_TRUE(written.ok()) << written.status();
  for (const char* file : {"model.onnx", "genai_config.json", "tokenizer.json", "tokenizer_config.json",
                           "onnxopt_report.json"}) {
    EXPECT_TRUE(fs::exists(out / file)) << file;
  }
  EXPECT_FALSE(fs::exists(out / "config.json")) << "GenAI reads genai_config.json; the HF config stays behind";
  EXPECT_FALSE(notes.empty());
  absl::StatusOr<std::string> json = ReadFile(out / "genai_config.json");
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(ParseAsGenai(*json).model().decoder().num_hidden_layers(), 4);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_NE(entry.path().filename().string().rfind(".onnxopt-", 0), 0u) << "staging left behind";
  }
  absl::StatusOr<std::vector<fs::path>> again = WriteGenaiFolder(LocalResultFiles(Download()), TunedCpuReport(), WithHfFiles(), out, &notes);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(again.status().message(), "GENAI_FOLDER_EXISTS")) << again.status();
  // An empty folder is taken.
  fs::create_directories(dir_ / "empty");
  EXPECT_TRUE(WriteGenaiFolder(LocalResultFiles(Download()), TunedCpuReport(), WithHfFiles(), dir_ / "empty", &notes).ok());
}

// A decoder past protobuf's 2 GiB (its embedding table in a sparse 2 GiB model.onnx.data, so the test
// writes nothing): the folder reads the graph and moves the data file, never reading the model whole.
TEST_F(GenaiFolderTest, ADecoderPastTwoGibibytesIsMovedNotRead) {
  const fs::path folder = dir_ / "download";
  onnx::ModelProto model = Decoder(2, CachePast, CachePresent);
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  onnx::GraphProto* graph = model.mutable_graph();
  onnx::TensorProto* table = graph->add_initializer();
  table->set_name("embed_tokens.weight");
  table->set_data_type(onnx::TensorProto::FLOAT);
  table->add_dims(131072);
  table->add_dims(4096);
  table->set_data_location(onnx::TensorProto::EXTERNAL);
  for (auto [key, value] : {std::pair<std::string, std::string>{"location", "model.onnx.data"}, {"offset", "0"},
                            {"length", std::to_string(int64_t{131072} * 4096 * 4)}}) {
    auto* entry = table->add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  }
  onnx::NodeProto* gather = graph->add_node();
  gather->set_op_type("Gather");
  gather->add_input("embed_tokens.weight");
  gather->add_input("tokens");
  gather->add_output("embedded");
  ASSERT_TRUE(WriteFileAtomically(folder / "model.onnx", model.SerializeAsString()).ok());
  { std::ofstream(folder / "model.onnx.data", std::ios::binary); }
  fs::resize_file(folder / "model.onnx.data", uintmax_t{131072} * 4096 * 4);
  ASSERT_TRUE(WriteFileAtomically(folder / "report.json", "{}").ok());

  const fs::path out = dir_ / "big";
  std::vector<std::string> notes;
  absl::StatusOr<std::vector<fs::path>> written = WriteGenaiFolder(
      LocalResultFiles({folder / "model.onnx", folder / "model.onnx.data", folder / "report.json"}), v1::Report(), GenaiOptions(), out,
      &notes);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(fs::file_size(out / "model.onnx.data"), uintmax_t{131072} * 4096 * 4);
  absl::StatusOr<std::string> json = ReadFile(out / "genai_config.json");
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(ParseAsGenai(*json).model().decoder().hidden_size(), 4096) << "the embedding table's width";
}

}  // namespace
}  // namespace onnxopt::client
