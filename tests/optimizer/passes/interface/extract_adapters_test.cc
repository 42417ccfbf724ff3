// extract_adapters on LoRA models of both exporters and several shapes: the Hugging Face peft exports
// (BERT and LLaMA, r=8 on query/value) and the project's own (tests/fixtures/make_lora_fixtures.py:
// BERT hidden 96 / 3 heads with r=4 on five projections, LLaMA 3 heads over 1 key/value head with r=6
// on q/k/v/o). Each branch becomes two adapter inputs, the attention stays fused, and in ONNX Runtime
// the model with its extracted adapter active (the adapter API) matches the original; a second adapter
// converted from its peft checkpoint matches the model rebuilt with it; no adapter runs the base model.
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "optimizer/lora_adapter.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/pass_manager.h"
#include "optimizer/peft_adapter.h"
#include "optimizer/validation/parity.h"
#include "tests/parity_matchers.h"
#include "tests/model_builder.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

struct LoraFixture {
  const char* path;      // under tests/fixtures, without ".onnx"
  int modules;           // adapted projections
  const char* a_module;  // one of them, as the inputs name it
};

const LoraFixture kFixtures[] = {
    {"hf/bert_lora_torchscript", 4, "encoder.layer.1.attention.self.value"},
    {"hf/bert_lora_dynamo", 4, "encoder.layer.0.attention.self.query"},
    {"hf/llama_lora_torchscript", 4, "layers.1.self_attn.q_proj"},
    {"hf/llama_lora_dynamo", 4, "layers.0.self_attn.v_proj"},
    {"lora/bert_r4", 10, "layer.1.intermediate"},
    {"lora/llama_r6", 8, "layers.0.self_attn.o_proj"},
};
constexpr int kLayers = 2;  // every fixture's

void PrintTo(const LoraFixture& f, std::ostream* os) { *os << f.path; }

constexpr char kExtractThenTransformer[] =
    R"({"preset": "transformer", "passesBefore": [{"name": "extract_adapters"}]})";

// ONNX Runtime's fused operators in `model`, by type.
std::map<std::string, int> FusedOps(const onnx::ModelProto& model) {
  std::map<std::string, int> ops;
  for (const auto& node : model.graph().node()) {
    if (node.domain() == "com.microsoft") ++ops[node.op_type()];
  }
  return ops;
}

// The model and its adapter as a job delivers them: the defaults moved into the adapter's bytes.
struct Delivered {
  onnx::ModelProto model;
  std::string adapter;
  std::vector<onnx::TensorProto> parameters;
};

Delivered Deliver(onnx::ModelProto model) {
  Delivered delivered;
  delivered.parameters = TakeAdapterDefaults(&model);
  delivered.model = std::move(model);
  auto bytes = SerializeAdapter(delivered.parameters);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (bytes.ok()) delivered.adapter = *std::move(bytes);
  return delivered;
}

// Parity of `candidate` (with `adapter` bytes active, or none) against `reference` on padded inputs.
v1::ParityReport Compare(const onnx::ModelProto& reference, const onnx::ModelProto& candidate,
                         const std::string& adapter) {
  v1::ParityReport report;
  auto original = testing::SessionOf(reference, ORT_DISABLE_ALL);
  auto optimized = testing::SessionOf(candidate, ORT_DISABLE_ALL);
  if (original == nullptr || optimized == nullptr) return report;
  std::optional<Ort::LoraAdapter> lora;
  Ort::RunOptions options;
  if (!adapter.empty()) {
    auto loaded = LoadLoraAdapter(adapter);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) return report;
    lora = *std::move(loaded);
    options.AddActiveLoraAdapter(*lora);
  }
  v1::ValidationConfig config;
  (*config.mutable_dim_values())["batch"] = 2;
  (*config.mutable_dim_values())["sequence"] = 11;
  absl::Status checked = CheckParity({*original, reference, *optimized, "fp32", adapter.empty() ? nullptr : &options},
                                     config, {}, RunContext(), &report);
  EXPECT_TRUE(checked.ok()) << checked;
  return report;
}

class ExtractAdaptersTest : public ::testing::TestWithParam<LoraFixture> {
 protected:
  void SetUp() override {
    auto loaded = LoadModel(testing::FixturePath(absl::StrCat(GetParam().path, ".onnx")));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    original_ = *std::move(loaded);
    testing::PassRun run = testing::RunConfig(kExtractThenTransformer, original_);
    ASSERT_TRUE(run.status.ok()) << run.status;
    extracted_ = std::move(run.model);
    reports_ = std::move(run.reports);
  }
  onnx::ModelProto original_, extracted_;
  std::vector<v1::PassReport> reports_;
};

TEST_P(ExtractAdaptersTest, EveryBranchBecomesInputsAndTheAttentionStaysFused) {
  const LoraFixture& fixture = GetParam();
  ASSERT_EQ(reports_.front().name(), "extract_adapters");
  EXPECT_EQ(reports_.front().rewrites(), fixture.modules) << reports_.front().ShortDebugString();
  const auto inputs = AdapterInputs(extracted_);
  EXPECT_EQ(inputs.size(), 2u * fixture.modules);
  bool named = false;
  for (const auto* input : inputs) named |= input->name() == AdapterParameterName(fixture.a_module, 'A');
  EXPECT_TRUE(named) << "no input for " << fixture.a_module << "; first: " << inputs.front()->name();
  const auto& a_shape = inputs.front()->type().tensor_type().shape();
  EXPECT_EQ(a_shape.dim(1).dim_param(), kAdapterRankDim);
  // Fused as the model with its adapter built in is: the attention of every layer, and the rest.
  testing::PassRun built_in = testing::RunConfig(R"({"preset": "transformer"})", original_);
  const std::map<std::string, int> fused = FusedOps(extracted_);
  EXPECT_EQ(fused, FusedOps(built_in.model));
  const auto attention = fused.find(fused.count("MultiHeadAttention") ? "MultiHeadAttention" : "GroupQueryAttention");
  ASSERT_NE(attention, fused.end());
  EXPECT_EQ(attention->second, kLayers);
}

TEST_P(ExtractAdaptersTest, WithItsAdapterActiveTheModelMatchesTheOriginal) {
  Delivered delivered = Deliver(extracted_);
  ASSERT_EQ(delivered.parameters.size(), 2u * GetParam().modules);
  ASSERT_TRUE(CheckAdapterFitsModel(delivered.parameters, delivered.model).ok());
  v1::ParityReport adapted = Compare(original_, delivered.model, delivered.adapter);
  EXPECT_TRUE(adapted.passed()) << adapted.ShortDebugString();
  // No adapter: the base model, which the original is not.
  v1::ParityReport base = Compare(original_, delivered.model, "");
  EXPECT_FALSE(base.passed()) << "the adapter changes nothing?";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExtractAdaptersTest, ::testing::ValuesIn(kFixtures));

// A second adapter (other A and B, other alpha; rslora for the LLaMA one), converted from its peft
// checkpoint, swapped in at run time: the same outputs as the model rebuilt with it. The first
// adapter's checkpoint converts to what extraction took out of the graph.
class SwappedAdapterTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SwappedAdapterTest, AConvertedCheckpointMatchesTheModelRebuiltWithIt) {
  const std::string name = GetParam();
  auto original = LoadModel(testing::FixturePath(absl::StrCat("lora/", name, ".onnx")));
  auto rebuilt = LoadModel(testing::FixturePath(absl::StrCat("lora/", name, "_second.onnx")));
  ASSERT_TRUE(original.ok() && rebuilt.ok());
  testing::PassRun run = testing::RunConfig(kExtractThenTransformer, *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  Delivered delivered = Deliver(std::move(run.model));
  for (const char* adapter : {"_first", "_second"}) {
    std::vector<std::string> notes;
    auto parameters =
        ConvertPeftCheckpoint(testing::FixturePath(absl::StrCat("lora/", name, adapter)), delivered.model, &notes);
    ASSERT_TRUE(parameters.ok()) << parameters.status();
    EXPECT_TRUE(notes.empty()) << notes.front();
    auto bytes = SerializeAdapter(*parameters);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const onnx::ModelProto& reference = std::string(adapter) == "_first" ? *original : *rebuilt;
    v1::ParityReport report = Compare(reference, delivered.model, *bytes);
    EXPECT_TRUE(report.passed()) << adapter << ": " << report.ShortDebugString();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SwappedAdapterTest, ::testing::Values("bert_r4", "llama_r6"));

TEST(ExtractAdaptersParams, ModulesPicksWhichBranchesLeave) {
  auto original = LoadModel(testing::FixturePath("lora/bert_r4.onnx"));
  ASSERT_TRUE(original.ok());
  testing::PassRun run = testing::RunConfig(
      R"({"passes": [{"name": "extract_adapters", "params": {"modules": "query, intermediate"}}]})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.report.rewrites(), 4);
  EXPECT_EQ(testing::SkipCount(run.report, "`modules` parameter leaves out"), 6);
  for (const auto* input : AdapterInputs(run.model)) {
    EXPECT_TRUE(absl::StrContains(input->name(), "query") || absl::StrContains(input->name(), "intermediate"))
        << input->name();
  }
}

// Two adapters active on every projection (tests/fixtures/lora/bert_r4_two.onnx): one input pair of rank
// 8 per module (concatenated), or a pair of rank 4 for each; either way the model with the extracted
// adapter matches, and so does one adapter converted from the two peft checkpoints.
TEST(ExtractAdaptersParams, SeveralActiveAdaptersConcatenateOrStayApart) {
  auto original = LoadModel(testing::FixturePath("lora/bert_r4_two.onnx"));
  ASSERT_TRUE(original.ok());
  for (const bool concatenate : {true, false}) {
    testing::PassRun run = testing::RunConfig(
        absl::StrCat(
            R"({"preset": "transformer", "passesBefore": [{"name": "extract_adapters", "params": {"concatenate": )",
            concatenate ? "true" : "false", "}}]}"),
        *original);
    ASSERT_TRUE(run.status.ok()) << run.status;
    const auto inputs = AdapterInputs(run.model);
    ASSERT_EQ(inputs.size(), concatenate ? 20u : 40u);
    EXPECT_EQ(run.reports.front().rewrites(), concatenate ? 10 : 20);
    Delivered delivered = Deliver(run.model);
    EXPECT_EQ(delivered.parameters.front().dims(1), concatenate ? 8 : 4) << "the ranks side by side";
    v1::ParityReport report = Compare(*original, delivered.model, delivered.adapter);
    EXPECT_TRUE(report.passed()) << concatenate << ": " << report.ShortDebugString();
    if (!concatenate) continue;
    std::vector<std::vector<onnx::TensorProto>> adapters;
    for (const char* folder : {"lora/bert_r4_two_a", "lora/bert_r4_two_b"}) {
      auto converted = ConvertPeftCheckpoint(testing::FixturePath(folder), delivered.model, nullptr);
      ASSERT_TRUE(converted.ok()) << converted.status();
      adapters.push_back(*converted);
    }
    auto combined = ConcatenateAdapters(adapters);
    ASSERT_TRUE(combined.ok()) << combined.status();
    auto bytes = SerializeAdapter(*combined);
    ASSERT_TRUE(bytes.ok());
    v1::ParityReport converted = Compare(*original, delivered.model, *bytes);
    EXPECT_TRUE(converted.passed()) << converted.ShortDebugString();
    v1::ParityReport one = Compare(*original, delivered.model, *SerializeAdapter(adapters[0]));
    EXPECT_FALSE(one.passed()) << "one of the two adapters alone is not both";
  }
}

// A job that extracts the adapters of a classifier and packages it (new outputs): the adapter is checked
// on the validated interface first, then the packaging runs, and both reach the saved model.
TEST(ExtractAdaptersJob, AdaptersAndPackagingTogether) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("lora/roberta_cls_r4.onnx");
  request.output_dir = testing::TempDir("lora_packaged");
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"preset": "transformer", "benchmark": {"skip": true},
                      "passesBefore": [{"name": "extract_adapters"}],
                      "passesAfter": [{"name": "append_classification_postprocessing", "params": {"top_k": 2}}]})",
                  &request.config)
                  .ok());
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::AdapterReport& adapter = result->report.adapter();
  EXPECT_EQ(adapter.modules_size(), 4);
  EXPECT_TRUE(adapter.parity().passed()) << adapter.ShortDebugString();
  EXPECT_GT(adapter.base_max_abs_diff(), 0);
  ASSERT_EQ(result->files.size(), 2u);
  EXPECT_EQ(result->files.back().filename(), kAdapterFileName);
  auto saved = LoadModel(result->files.front());
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->graph().output_size(), 4);
  EXPECT_EQ(AdapterInputs(*saved).size(), 8u);
  for (const auto& tensor : saved->graph().initializer()) {
    if (ParseAdapterParameterName(tensor.name())) EXPECT_EQ(TensorDataBytes(tensor), 0) << "empty defaults";
  }
}

TEST(ExtractAdaptersParams, TheInputsOutliveEliminateInitializerInputs) {
  auto original = LoadModel(testing::FixturePath("lora/bert_r4.onnx"));
  ASSERT_TRUE(original.ok());
  testing::PassRun run =
      testing::RunConfig(R"({"preset": "extended", "passesBefore": [{"name": "extract_adapters"}]})", *original);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(AdapterInputs(run.model).size(), 20u) << "extended's eliminate_initializer_inputs must keep them";
}

}  // namespace
}  // namespace onnxopt
