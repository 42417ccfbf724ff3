// Decoders exported for generation with a key/value cache (past inputs, present outputs): Qwen2 through
// torch 2.11's TorchScript exporter (tests/fixtures/hf/qwen2_kv_torchscript.onnx) and the project's own
// Qwen2-style decoders of other head ratios (tests/bench/make_cache_decoder.py, torch 1.13). The
// transformer preset fuses each layer's rotary attention over Concat(past, new) into RotaryEmbedding +
// GroupQueryAttention with the past and present, the inputs and outputs keep their names, and ONNX
// Runtime gives the same outputs on batches padded on the left and on the right, at prefill and decode
// shapes, and the same tokens in a greedy generation that feeds the presents back.
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/cache_interface.h"
#include "optimizer/model_io.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/transformer_report.h"
#include "optimizer/validation/generation.h"
#include "optimizer/validation/parity.h"
#include "tests/cache_decoder_checks.h"
#include "tests/parity_matchers.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

struct CacheFixture {
  const char* path;
  int layers;
  int kv_heads;
  const char* family;
  const char* fused_as = "GroupQueryAttention";
};

const CacheFixture kFixtures[] = {
    {"hf/qwen2_kv_torchscript", 2, 1, "qwen2"},  // 2 heads sharing 1 key/value head, head size 32
    {"cache/cache_decoder_gqa3", 2, 2, "qwen2"},  // 6 heads over 2 key/value heads, head size 16
    {"cache/cache_decoder_mha", 3, 4, "qwen2"},   // as many key/value heads as heads: no repeat_kv
    // Head size 12, which GroupQueryAttention's kernel refuses: MultiHeadAttention over the heads the
    // graph computes, its keys longer than the queries in a chunk after a past.
    {"cache/cache_decoder_head12", 2, 2, "qwen2", "MultiHeadAttention"},
};

void PrintTo(const CacheFixture& f, std::ostream* os) { *os << f.path; }

// The fixture `path` (under tests/fixtures, without ".onnx") and what the transformer preset makes of it.
void LoadAndOptimize(const std::string& path, onnx::ModelProto* original, onnx::ModelProto* optimized) {
  auto loaded = LoadModel(testing::FixturePath(absl::StrCat(path, ".onnx")));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  *original = *std::move(loaded);
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", *original);
  ASSERT_TRUE(run.status.ok()) << path << ": " << run.status;
  *optimized = std::move(run.model);
}

class CacheDecoderTest : public ::testing::TestWithParam<CacheFixture> {
 protected:
  void SetUp() override { LoadAndOptimize(GetParam().path, &original_, &optimized_); }
  onnx::ModelProto original_, optimized_;
};

TEST_P(CacheDecoderTest, InterfaceIsReadFromTheDeclaredTypes) {
  const std::optional<CacheInterface> cache = FindCacheInterface(original_.graph());
  ASSERT_TRUE(cache.has_value());
  EXPECT_EQ(cache->entries.size(), static_cast<size_t>(2 * GetParam().layers));
  EXPECT_EQ(cache->entries[0].past, "past_key_values.0.key");
  EXPECT_EQ(cache->entries[0].present, "present.0.key");
  EXPECT_EQ(cache->entries[0].axis, 2);
  EXPECT_EQ(cache->past_dim, "past_sequence");
  EXPECT_EQ(cache->new_dim, "sequence");
  EXPECT_EQ(cache->total_dim, "total_sequence");
  EXPECT_EQ(cache->ids_input, "input_ids");
  EXPECT_EQ(cache->mask_input, "attention_mask");
  EXPECT_EQ(cache->logits_output, "logits");
  EXPECT_EQ(cache->RoleValue("total_sequence", 7, 3), 10);
  // The optimized model keeps its interface.
  const std::optional<CacheInterface> kept = FindCacheInterface(optimized_.graph());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->entries.size(), cache->entries.size());
}

TEST_P(CacheDecoderTest, CachedAttentionFusesIntoGroupQueryAttentionWithPastAndPresent) {
  const CacheFixture& f = GetParam();
  std::map<std::string, int> ops;
  for (const auto& node : optimized_.graph().node()) ++ops[node.op_type()];
  if (std::string(f.fused_as) == "MultiHeadAttention") {
    // Over the heads the graph computes (the cache's Concats stay the presents), the causal + padding
    // condition as attention_bias: unidirectional would not be causal over keys longer than the queries.
    EXPECT_EQ(ops["MultiHeadAttention"], f.layers);
    EXPECT_EQ(ops.count("Softmax"), 0u);
    for (const auto& node : optimized_.graph().node()) {
      if (node.op_type() != "MultiHeadAttention") continue;
      ASSERT_EQ(node.input_size(), 6);
      EXPECT_FALSE(node.input(5).empty()) << "the mask goes in as attention_bias";
      for (const auto& attribute : node.attribute()) EXPECT_NE(attribute.name(), "unidirectional");
    }
    return;
  }
  EXPECT_EQ(ops["GroupQueryAttention"], f.layers);
  EXPECT_EQ(ops["RotaryEmbedding"], 2 * f.layers);
  EXPECT_EQ(ops.count("Softmax"), 0u);
  EXPECT_EQ(ops.count("IsNaN"), 0u);
  int layer = 0;
  for (const auto& node : optimized_.graph().node()) {
    if (node.op_type() != "GroupQueryAttention") continue;
    ASSERT_GE(node.input_size(), 11);
    EXPECT_EQ(node.input(3), absl::StrCat("past_key_values.", layer, ".key"));
    EXPECT_EQ(node.input(4), absl::StrCat("past_key_values.", layer, ".value"));
    EXPECT_FALSE(node.input(10).empty()) << "the padding goes in as attention_bias";
    ASSERT_EQ(node.output_size(), 3);
    EXPECT_EQ(node.output(1), absl::StrCat("present.", layer, ".key"));
    EXPECT_EQ(node.output(2), absl::StrCat("present.", layer, ".value"));
    for (const auto& attribute : node.attribute()) {
      if (attribute.name() == "kv_num_heads") {
        EXPECT_EQ(attribute.i(), f.kv_heads);
      }
    }
    ++layer;
  }
  bool noted = false;  // the pass report says which shapes the fused cache takes
  testing::PassRun run = testing::RunConfig(R"({"preset": "transformer"})", original_);
  for (const auto& pass : run.reports) {
    for (const auto& note : pass.notes()) noted |= absl::StrContains(note, "only at batch 1");
  }
  EXPECT_TRUE(noted);
  v1::TransformerReport report = JudgeTransformerFusion(original_, optimized_, {}, ModelHints());
  EXPECT_EQ(report.family(), f.family);
  EXPECT_TRUE(report.fully_fused()) << report.DebugString();
}

// Prefill (no past), decode (one token after a past) and a chunk after a past, on rows padded on the
// left (0, 2) and on the right (1) by up to 40% of the total length: left padding longer than the past
// masks the first rows entirely, which the original's NaN guard turns to zeros.
TEST_P(CacheDecoderTest, OutputsAndPresentsMatchOnPaddedBatchesAtPrefillAndDecode) {
  // ONNX Runtime's GroupQueryAttention takes a chunk after a past (sequence > 1) at batch 1 only.
  testing::ExpectCacheParityOnPaddedBatches(original_, optimized_, {{3, 0, 16}, {3, 0, 128}, {3, 16, 1}, {3, 130, 1}, {1, 9, 7}},
                                            2 * GetParam().layers);
}

TEST_P(CacheDecoderTest, GreedyGenerationPicksTheSameTokens) {
  const v1::GenerationReport report = testing::ExpectIdenticalGreedyGeneration(original_, optimized_, 24);
  EXPECT_GE(report.mean_kl_divergence(), 0.0);
  // The two rows (one padded on the left) generate different text: the padding is seen.
  bool rows_differ = false;
  for (const auto& step : report.steps()) rows_differ |= step.original_tokens(0) != step.original_tokens(1);
  EXPECT_TRUE(rows_differ);
}

INSTANTIATE_TEST_SUITE_P(Decoders, CacheDecoderTest, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<CacheFixture>& info) {
                           std::string name = info.param.path;
                           return name.substr(name.find('/') + 1);
                         });

// The generation benchmark times each phase of both models and says how fast each generates.
TEST(GenerationBenchmarkTest, TimesPrefillAndDecodePerBatchAndPast) {
  onnx::ModelProto original, optimized;
  ASSERT_NO_FATAL_FAILURE(LoadAndOptimize("cache/cache_decoder_gqa3", &original, &optimized));
  auto a = testing::SessionOf(original, ORT_DISABLE_ALL);
  auto b = testing::SessionOf(optimized, ORT_DISABLE_ALL);
  ASSERT_TRUE(a && b);
  v1::GenerationConfig settings;
  settings.add_batch_sizes(1);
  settings.add_batch_sizes(2);
  settings.set_prefill_tokens(8);
  settings.add_decode_past(4);
  settings.add_decode_past(40);
  settings.set_greedy_tokens(4);
  settings.set_runs(3);
  absl::StatusOr<v1::GenerationConfig> config = ResolveGenerationConfig(settings);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<v1::GenerationReport> report = BenchmarkGeneration(
      *a, *b, original, *FindCacheInterface(original.graph()), *config, true, 0, TimingOn(v1::DEVICE_CPU), RunContext());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->phases_size(), 6);  // per batch: prefill and two decode steps
  EXPECT_EQ(report->phases(0).phase(), "prefill");
  EXPECT_EQ(report->phases(0).new_tokens(), 8);
  EXPECT_EQ(report->phases(2).phase(), "decode");
  EXPECT_EQ(report->phases(2).past(), 40);
  EXPECT_EQ(report->phases(3).batch(), 2);
  for (const auto& phase : report->phases()) {
    EXPECT_TRUE(phase.error().empty()) << phase.error();
    EXPECT_EQ(phase.original().runs(), 3);
    EXPECT_GT(phase.optimized_tokens_per_second(), 0);
    EXPECT_NEAR(phase.optimized_ms_per_token() * phase.new_tokens(), phase.optimized().p50_ms(), 1e-9);
  }
  EXPECT_TRUE(report->passed());
  EXPECT_EQ(report->past_inputs_size(), 4);
}

TEST(GenerationBenchmarkTest, RefusesSettingsOutOfRange) {
  v1::GenerationConfig settings;
  settings.add_batch_sizes(0);
  EXPECT_EQ(ResolveGenerationConfig(settings).status().code(), absl::StatusCode::kInvalidArgument);
  settings.clear_batch_sizes();
  settings.set_greedy_tokens(-1);
  EXPECT_EQ(ResolveGenerationConfig(settings).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::GenerationConfig> defaults = ResolveGenerationConfig({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->prefill_tokens(), 128);
  EXPECT_EQ(defaults->decode_past_size(), 3);
  EXPECT_EQ(defaults->greedy_tokens(), 64);
}

// One-shot decoders (no cache) on a prompt padded on the left, as generation batches are: the first
// positions of row 0 see nothing but padding (the NaN guard's zeros in the original), the fused model
// zeroes them too, and row 1 (unpadded) is unaffected.
TEST(LeftPaddingTest, OneShotDecodersMatchOnLeftPaddedPrompts) {
  for (const char* name : {"hf/qwen2_torchscript", "hf/llama_torchscript", "hf/gpt2_torchscript",
                           "hf/mistral_torchscript", "hf/phi3_torchscript"}) {
    onnx::ModelProto original, optimized;
    ASSERT_NO_FATAL_FAILURE(LoadAndOptimize(name, &original, &optimized));
    auto a = testing::SessionOf(original, ORT_DISABLE_ALL);
    auto b = testing::SessionOf(optimized, ORT_DISABLE_ALL);
    ASSERT_TRUE(a && b);
    constexpr int64_t kLength = 16, kPadded = 6;
    SuppliedSample sample;
    std::vector<int64_t> ids, mask;
    for (int64_t row = 0; row < 2; ++row) {
      for (int64_t t = 0; t < kLength; ++t) {
        ids.push_back((7 * t + 3 * row + 1) % 50);
        mask.push_back(row == 0 && t < kPadded ? 0 : 1);
      }
    }
    auto tensor = [](const std::string& input, const std::vector<int64_t>& values) {
      onnx::TensorProto proto;
      proto.set_name(input);
      proto.set_data_type(onnx::TensorProto::INT64);
      proto.add_dims(2);
      proto.add_dims(kLength);
      for (int64_t v : values) proto.add_int64_data(v);
      return proto;
    };
    for (const auto& input : original.graph().input()) {
      if (input.name() == "input_ids") sample[input.name()] = tensor(input.name(), ids);
      if (input.name() == "attention_mask") sample[input.name()] = tensor(input.name(), mask);
    }
    ASSERT_EQ(sample.size(), 2u) << name;
    v1::ValidationConfig config;
    config.set_atol(1e-4);
    config.set_rtol(0);
    v1::ParityReport report;
    absl::Status status = CheckParity({*a, original, *b}, config, {sample}, RunContext(), &report);
    ASSERT_TRUE(status.ok()) << name << ": " << status;
    EXPECT_TRUE(report.passed()) << name << ": " << report.DebugString();
  }
}

// Validation and the benchmark run a cache model as generation does unless the config names shapes:
// a prefill without a past and a one-token decode step.
TEST(CacheInterfaceTest, ValidationShapesArePrefillAndDecodeByDefault) {
  auto model = LoadModel(testing::FixturePath("hf/qwen2_kv_torchscript.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  v1::ValidationConfig config;
  (*config.mutable_dim_values())["batch"] = 2;
  (*config.mutable_dim_values())["sequence"] = 24;
  std::vector<DimValues> sets = InputShapeSets(config, false, *model);
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(sets[0], (DimValues{{"batch", 2}, {"past_sequence", 0}, {"sequence", 24}}));
  EXPECT_EQ(sets[1], (DimValues{{"batch", 2}, {"sequence", 1}})) << "a decode step is one token";
  const std::vector<DimValues> parity_sets = ParityShapeSets(config, false, *model);
  ASSERT_EQ(parity_sets.size(), 3u);
  EXPECT_EQ(parity_sets[2], (DimValues{{"batch", 1}, {"sequence", 4}})) << "parity also checks a chunk after a past";
  EXPECT_EQ(ParityShapeSets(config, true, *model).size(), 1u) << "supplied inputs are their own shapes";
  config.clear_dim_values();
  (*config.mutable_dim_values())["batch"] = 2;
  (*config.add_shapes()->mutable_dim_values())["sequence"] = 5;  // the config's own shapes win
  sets = InputShapeSets(config, false, *model);
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0], (DimValues{{"batch", 2}, {"sequence", 5}}));
  // A past of 0 can be asked for by name (an empty dim); a negative one cannot.
  (*config.mutable_shapes(0)->mutable_dim_values())["past_sequence"] = 0;
  EXPECT_TRUE(CheckValidationSettings(config).ok());
  (*config.mutable_shapes(0)->mutable_dim_values())["past_sequence"] = -1;
  EXPECT_EQ(CheckValidationSettings(config).code(), absl::StatusCode::kInvalidArgument);
  auto encoder = LoadModel(testing::FixturePath("hf/bert_torchscript.onnx"));
  ASSERT_TRUE(encoder.ok());
  EXPECT_EQ(InputShapeSets(v1::ValidationConfig(), false, *encoder).size(), 1u);
}

// A model without a cache has no interface: the encoders and one-shot decoders stay as they were.
TEST(CacheInterfaceTest, OneShotModelsHaveNone) {
  for (const char* path : {"hf/qwen2_torchscript.onnx", "hf/gpt2_torchscript.onnx", "hf/bert_torchscript.onnx"}) {
    auto model = LoadModel(testing::FixturePath(path));
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_FALSE(FindCacheInterface(model->graph()).has_value()) << path;
  }
}

}  // namespace
}  // namespace onnxopt
