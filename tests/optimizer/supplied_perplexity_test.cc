// A decoder job given token ids (--inputs) is scored on them: perplexity of the original and of the result,
// teacher-forced, on the trained decoder (tests/fixtures/cache/trained_decoder.onnx) reading text of the
// language it learned (tests/fixtures/make_trained_decoder.py's alphabet).
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "tests/model_builder.h"
#include "tests/quality_figures.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;

// make_trained_decoder.py's ALPHABET: a character's id is its last index there.
std::vector<int64_t> Encode(const std::string& text) {
  const std::string alphabet = "\n0123456789+=;r:>c,abcdefghijklmnop";
  std::vector<int64_t> ids;
  for (char c : text) ids.push_back(static_cast<int64_t>(alphabet.rfind(c)));
  return ids;
}

void WriteTensor(const onnx::TensorProto& tensor, const fs::path& path) {
  std::ofstream out(path, std::ios::binary);
  ASSERT_TRUE(tensor.SerializeToOstream(&out));
}

// One supplied set: the ids and mask of `text` (one row) and every past empty, shaped as the model says.
std::map<std::string, fs::path> SuppliedText(const std::string& text, const fs::path& dir, int64_t bad_id = -1) {
  std::map<std::string, fs::path> files;
  absl::StatusOr<onnx::ModelProto> model = LoadModel(testing::FixturePath("cache/trained_decoder.onnx"));
  EXPECT_TRUE(model.ok()) << model.status();
  std::vector<int64_t> ids = Encode(text);
  if (bad_id >= 0) ids.back() = bad_id;
  const int64_t length = static_cast<int64_t>(ids.size());
  for (const auto& input : model->graph().input()) {
    onnx::TensorProto tensor;
    tensor.set_name(input.name());
    if (input.name() == "input_ids" || input.name() == "attention_mask") {
      tensor.set_data_type(onnx::TensorProto::INT64);
      tensor.add_dims(1);
      tensor.add_dims(length);
      for (int64_t i = 0; i < length; ++i) tensor.add_int64_data(input.name() == "input_ids" ? ids[i] : 1);
    } else {  // a past: [batch 1, heads, 0, head size]
      tensor.set_data_type(onnx::TensorProto::FLOAT);
      const auto& dims = input.type().tensor_type().shape().dim();
      for (int d = 0; d < dims.size(); ++d) tensor.add_dims(d == 0 ? 1 : d == 2 ? 0 : dims[d].dim_value());
    }
    files[input.name()] = dir / (input.name() + ".pb");
    WriteTensor(tensor, files[input.name()]);
  }
  return files;
}

constexpr char kText[] = "\n37+485=522;r:cafe>efac;c:7,8,9,10;12+34=46;r:bead>daeb;c:3,4,5,6;";

OptimizeRequest Request(const std::string& name, const std::string& text, int64_t bad_id = -1) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("cache/trained_decoder.onnx");
  const fs::path dir = testing::TempDir(name);
  request.output_dir = dir / "out";
  request.input_files = {SuppliedText(text, dir, bad_id)};
  request.config.mutable_benchmark()->set_skip(true);
  return request;
}

TEST(SuppliedPerplexityTest, TheOriginalAndTheResultAreScoredOnTheSuppliedText) {
  OptimizeRequest request = Request("perplexity_fp32", kText);
  absl::StatusOr<OptimizeResult> result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::PerplexityReport& perplexity = result->report.parity().perplexity();
  ::testing::Test::RecordProperty("note", perplexity.note());
  EXPECT_EQ(perplexity.tokens(), static_cast<int64_t>(std::string(kText).size()) - 1);
  EXPECT_GT(perplexity.original(), 1.0);
  EXPECT_LT(perplexity.original(), 24.0) << "the decoder knows this language: far below its 48-token vocabulary";
  EXPECT_NEAR(perplexity.ratio(), 1.0, 1e-3) << "fusion keeps the arithmetic";
  EXPECT_TRUE(perplexity.passed());
  EXPECT_EQ(perplexity.max_ratio_allowed(), 0);
  EXPECT_TRUE(absl::StrContains(perplexity.note(), "reported only")) << perplexity.note();
}

TEST(SuppliedPerplexityTest, RandomTextIsLessLikelyThanTheLanguage) {
  absl::StatusOr<OptimizeResult> language = Optimize(Request("perplexity_language", kText));
  absl::StatusOr<OptimizeResult> noise = Optimize(Request("perplexity_noise", "\np9:,>o;n+ma=r0kj3;c8fi;hg7d"));
  ASSERT_TRUE(language.ok()) << language.status();
  ASSERT_TRUE(noise.ok()) << noise.status();
  ::testing::Test::RecordProperty("noise", noise->report.parity().perplexity().note());
  EXPECT_GT(noise->report.parity().perplexity().original(), 2 * language->report.parity().perplexity().original());
}

TEST(SuppliedPerplexityTest, Int4IsJudgedOnItsPerplexityWhereABoundIsSet) {
  OptimizeRequest request = Request("perplexity_int4", kText);
  request.config.mutable_precision()->set_mode(v1::PrecisionConfig::int4_weight_only);
  request.config.mutable_precision()->set_auto_mixed(false);
  request.config.mutable_validation()->set_max_perplexity_ratio(1.5);
  // Every output passes the prefill's element-wise judge with room on any CPU (KL 0.0037, lowest cosine
  // 0.997 measured): perplexity is what this test is about.
  testing::JudgeLeniently(request.config.mutable_validation());
  absl::StatusOr<OptimizeResult> result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::PerplexityReport& perplexity = result->report.parity().perplexity();
  ::testing::Test::RecordProperty("note", perplexity.note());
  EXPECT_EQ(result->report.precision().precision(), "int4") << result->report.precision().note();
  EXPECT_NE(perplexity.ratio(), 1.0) << "int4 moves the likelihoods";
  testing::ExpectExcessOverOneAtMost("perplexity ratio", perplexity.ratio(), 1.5);
  EXPECT_TRUE(perplexity.passed()) << perplexity.note();

  // A bound no quantized model meets fails it: the float32 model is returned.
  request = Request("perplexity_int4_strict", kText);
  request.config.mutable_precision()->set_mode(v1::PrecisionConfig::int4_weight_only);
  request.config.mutable_precision()->set_auto_mixed(false);
  request.config.mutable_validation()->set_max_perplexity_ratio(1.0 + 1e-9);
  testing::JudgeLeniently(request.config.mutable_validation());
  request.config.mutable_validation()->set_max_kl_divergence(1.0);  // the logits pass: only perplexity decides
  result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->report.precision().precision(), "fp32") << result->report.precision().note();
  EXPECT_TRUE(absl::StrContains(result->report.precision().note(), "perplexity")) << result->report.precision().note();
}

TEST(SuppliedPerplexityTest, IdsOutsideTheVocabularyAreTheUsersError) {
  absl::StatusOr<OptimizeResult> result = Optimize(Request("perplexity_bad_id", kText, /*bad_id=*/4800));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
}

}  // namespace
}  // namespace onnxopt
