// The adapter file format (ONNX Runtime's .onnx_adapter), safetensors and peft checkpoints, as users
// hand them in: what round-trips, what ONNX Runtime accepts, and a clear error (never a crash) for every
// truncation, lying header and mismatch with the model.
#include "optimizer/lora_adapter.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/passes/constants.h"
#include "optimizer/peft_adapter.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;

std::vector<onnx::TensorProto> SomeParameters() {
  return {MakeFloatTensor("layers.0.q_proj.lora_A.weight", {3, 2}, {1, 2, 3, 4, 5, 6}),
          MakeFloatTensor("layers.0.q_proj.lora_B.weight", {2, 5}, {0.5, -1, 2, 3, 4, 5, 6, 7, 8, 9})};
}

TEST(AdapterFormat, RoundTripsAndOnnxRuntimeLoadsIt) {
  auto bytes = SerializeAdapter(SomeParameters(), 3, 7);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->substr(4, 4), "TORT");
  auto parsed = ParseAdapter(*bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[1].name(), "layers.0.q_proj.lora_B.weight");
  EXPECT_EQ((*parsed)[1].dims(1), 5);
  EXPECT_EQ(TensorFloats((*parsed)[1]), TensorFloats(SomeParameters()[1]));
  // Payloads start on 16-byte offsets: ONNX Runtime maps the file and computes on the bytes in place.
  const size_t payload = bytes->find(std::string("\0\0\x80\x3f", 4));  // the first float, 1.0
  EXPECT_EQ(payload % 16, 0u) << payload;
  auto loaded = LoadLoraAdapter(*bytes);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

TEST(AdapterFormat, EveryTruncationAndCorruptionIsAClearError) {
  auto bytes = SerializeAdapter(SomeParameters());
  ASSERT_TRUE(bytes.ok());
  for (size_t length = 0; length < bytes->size(); ++length) {
    auto parsed = ParseAdapter(absl::string_view(*bytes).substr(0, length));
    EXPECT_FALSE(parsed.ok()) << "a file cut at " << length << " bytes parsed";
    if (!parsed.ok()) EXPECT_TRUE(absl::StartsWith(parsed.status().message(), "ADAPTER_INVALID")) << parsed.status();
  }
  // Every byte flipped in turn: an error or a file that still describes consistent tensors.
  for (size_t at = 0; at < bytes->size(); ++at) {
    std::string corrupt = *bytes;
    corrupt[at] = static_cast<char>(corrupt[at] ^ 0xA5);
    auto parsed = ParseAdapter(corrupt);
    if (parsed.ok()) {
      for (const auto& tensor : *parsed) EXPECT_EQ(TensorDataBytes(tensor), tensor.raw_data().size());
    }
  }
  // A header that lies: the first parameter's dims say 4 x 2 where 3 x 2 floats are stored.
  std::string lying = *bytes;
  const int64_t three = 3, four = 4;
  const size_t dim = lying.find(std::string(reinterpret_cast<const char*>(&three), 8));
  ASSERT_NE(dim, std::string::npos);
  std::memcpy(&lying[dim], &four, 8);
  auto parsed = ParseAdapter(lying);
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "holds 24 bytes, not 32")) << parsed.status();
  EXPECT_FALSE(LoadLoraAdapter(std::string(*bytes, 0, bytes->size() / 2)).ok()) << "ONNX Runtime refuses it too";
  EXPECT_FALSE(ParseAdapter("TORTTORT").ok());
  EXPECT_FALSE(ParseAdapter(std::string(64, '\0')).ok());
}

TEST(AdapterFormat, ANonMatchingAdapterIsNamed) {
  auto model = LoadModel(testing::FixturePath("lora/bert_r4.onnx"));
  ASSERT_TRUE(model.ok());
  testing::PassRun run = testing::RunPass("extract_adapters", *model);
  std::vector<onnx::TensorProto> wrong = SomeParameters();
  auto mismatch = CheckAdapterFitsModel(wrong, run.model);
  EXPECT_TRUE(absl::StrContains(mismatch.message(), "'layers.0.q_proj.lora_A.weight' is no adapter input")) << mismatch;
  std::vector<onnx::TensorProto> taken = TakeAdapterDefaults(&run.model);
  ASSERT_FALSE(taken.empty());
  EXPECT_TRUE(CheckAdapterFitsModel(taken, run.model).ok());
  onnx::TensorProto narrow = MakeFloatTensor(taken[0].name(), {95, 4}, std::vector<float>(95 * 4));
  auto shape = CheckAdapterFitsModel({narrow, taken[1]}, run.model);
  EXPECT_TRUE(absl::StrContains(shape.message(), "the model takes 96 along axis 0")) << shape;
  onnx::TensorProto ranked = MakeFloatTensor(taken[0].name(), {96, 5}, std::vector<float>(96 * 5));
  auto rank = CheckAdapterFitsModel({ranked, taken[1]}, run.model);
  EXPECT_TRUE(absl::StrContains(rank.message(), "rank 5 in lora_A and 4 in lora_B")) << rank;
}

TEST(AdapterFormat, ConcatenationChecksWhatItJoins) {
  auto joined = ConcatenateAdapters({SomeParameters(), SomeParameters()});
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ((*joined)[0].dims(1), 4) << "A [3, 2 + 2]";
  EXPECT_EQ((*joined)[1].dims(0), 4) << "B [2 + 2, 5]";
  EXPECT_EQ(TensorFloats((*joined)[0])->at(2), 1.0f) << "row 0: the first A's row, then the second's";
  std::vector<onnx::TensorProto> wider = SomeParameters();
  wider[0] = MakeFloatTensor(wider[0].name(), {4, 2}, std::vector<float>(8));
  EXPECT_TRUE(absl::StrContains(ConcatenateAdapters({SomeParameters(), wider}).status().message(), "ADAPTER_MISMATCH"));
  std::vector<onnx::TensorProto> short_data = SomeParameters();
  short_data[1].mutable_raw_data()->resize(8);
  short_data[1].clear_float_data();
  EXPECT_FALSE(ConcatenateAdapters({SomeParameters(), short_data}).ok());
  std::vector<onnx::TensorProto> misnamed = SomeParameters();
  misnamed[0].set_name("weight");
  EXPECT_TRUE(absl::StrContains(ConcatenateAdapters({misnamed}).status().message(), "no LoRA matrix"));
}

std::string Safetensors(const std::string& header, const std::string& data) {
  const uint64_t size = header.size();
  return std::string(reinterpret_cast<const char*>(&size), 8) + header + data;
}

TEST(Safetensors, ReadsAndRefusesWhatLies) {
  const std::string data(24, '\x01');
  auto good = ParseSafetensors(Safetensors(
      R"({"__metadata__": {"format": "pt"}, "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]},
          "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})",
      data));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->at("a").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(good->at("b").data.size(), 8u);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})", data).substr(0, 30),
       "the header says"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 24]}})", data), "spans 24 bytes"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})", data), "cover 16 of the 24"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [4], "data_offsets": [4, 20]}})",
                   data.substr(0, 20)),
       "overlap"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})",
                   data),
       "leave a hole"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 800]}})", data), "outside the 24"},
      {Safetensors(R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}})", data), "unknown dtype"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data), "not a list of sizes"},
      {Safetensors(R"([1, 2])", data), "not a JSON object"},
      {Safetensors("{\"a\": ", data), "not a JSON object"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "at most 100 MB"},
      {std::string("\x05\x00", 2), "fewer than its header size"},
  };
  for (const auto& [bytes, reason] : bad) {
    auto parsed = ParseSafetensors(bytes);
    ASSERT_FALSE(parsed.ok()) << reason;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), reason)) << parsed.status();
  }
}

// A copy of a fixture checkpoint to break.
class PeftCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("onnxopt_peft_", ::getpid());
    fs::remove_all(dir_);
    fs::copy(testing::FixturePath("lora/bert_r4_second"), dir_, fs::copy_options::recursive);
    auto model = LoadModel(testing::FixturePath("lora/bert_r4.onnx"));
    ASSERT_TRUE(model.ok());
    model_ = testing::RunPass("extract_adapters", *model).model;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& file, const std::string& bytes) {
    std::ofstream(dir_ / file, std::ios::binary) << bytes;
  }
  std::string Read(const std::string& file) { return *ReadFile(dir_ / file); }
  absl::Status Convert() { return ConvertPeftCheckpoint(dir_, model_, nullptr).status(); }
  fs::path dir_;
  onnx::ModelProto model_;
};

TEST_F(PeftCheckpointTest, WrongRankModuleDtypeAndTruncationAreNamed) {
  ASSERT_TRUE(Convert().ok()) << Convert();
  const std::string config = Read("adapter_config.json"), tensors = Read("adapter_model.safetensors");
  Write("adapter_config.json", absl::StrReplaceAll(config, {{"\"r\": 4", "\"r\": 8"}}));
  EXPECT_TRUE(absl::StrContains(Convert().message(), "has rank 4; adapter_config.json says 8")) << Convert();
  Write("adapter_config.json",
        absl::StrReplaceAll(config, {{"\"r\": 4", "\"r\": 8"}, {"\"rank_pattern\": {}", R"json("rank_pattern": {
                                         "layer.\\d.attention.(query|key|value)": 4, "attention_dense|intermediate": 4})json"}}));
  EXPECT_TRUE(Convert().ok()) << "rank_pattern overrides r per module: " << Convert();
  Write("adapter_config.json", absl::StrReplaceAll(config, {{"\"LORA\"", "\"IA3\""}}));
  EXPECT_TRUE(absl::StrContains(Convert().message(), "peft_type 'IA3'")) << Convert();
  Write("adapter_config.json", "{\"r\": 4");
  EXPECT_TRUE(absl::StrContains(Convert().message(), "not a JSON object")) << Convert();
  Write("adapter_config.json", config);
  Write("adapter_model.safetensors",
        absl::StrReplaceAll(tensors, {{"layer.0.attention.query", "layer.0.attention.qwery"}}));
  EXPECT_TRUE(absl::StrContains(Convert().message(), "adapts 'layer.0.attention.qwery'")) << Convert();
  Write("adapter_model.safetensors", absl::StrReplaceAll(tensors, {{"\"F32\"", "\"I32\""}}));
  EXPECT_TRUE(absl::StrContains(Convert().message(), "LoRA matrices must be F32, F16 or BF16")) << Convert();
  for (size_t cut : {size_t{3}, size_t{200}, tensors.size() - 1}) {
    Write("adapter_model.safetensors", tensors.substr(0, cut));
    EXPECT_TRUE(absl::StrContains(Convert().message(), "SAFETENSORS_INVALID")) << cut << ": " << Convert();
  }
  fs::remove(dir_ / "adapter_model.safetensors");
  EXPECT_EQ(Convert().code(), absl::StatusCode::kNotFound) << Convert();
  auto base = LoadModel(testing::FixturePath("lora/bert_r4.onnx"));
  Write("adapter_model.safetensors", tensors);
  EXPECT_TRUE(absl::StrContains(ConvertPeftCheckpoint(dir_, *base, nullptr).status().message(),
                                "optimize it with the extract_adapters pass first"));
}

}  // namespace
}  // namespace onnxopt
