// Numerical checks of a rewritten decoder with a key/value cache against its original, both graphs as
// written in ONNX Runtime: padded batches at prefill and decode, and a greedy generation.
#ifndef ONNXOPT_TESTS_CACHE_DECODER_CHECKS_H_
#define ONNXOPT_TESTS_CACHE_DECODER_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "optimizer/cache_interface.h"
#include "optimizer/validation/generation.h"
#include "optimizer/validation/parity.h"
#include "optimizer/model_io.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt::testing {

// A decoder fixture (`path` under tests/fixtures) and what the transformer preset makes of it: the test
// fixture of the decoder tests that check one spelling's fusion and numbers.
class TransformerPresetTest {
 protected:
  void LoadAndOptimize(const std::string& path) {
    auto loaded = LoadModel(FixturePath(path));
    ASSERT_TRUE(loaded.ok()) << path << ": " << loaded.status();
    original_ = *std::move(loaded);
    run_ = RunConfig(R"({"preset": "transformer"})", original_);
    ASSERT_TRUE(run_.status.ok()) << path << ": " << run_.status;
  }
  onnx::ModelProto original_;
  PassRun run_;
};

struct CacheShape {
  int64_t batch, past, sequence;
};

// Fails the test unless `optimized` gives `original`'s logits and presents within 1e-4 (rtol 0), two
// samples, rows padded by up to 40% of the total length (on the left and on the right), at each shape;
// `presents` counts the present outputs. With `skip_rows_masked_entirely`, queries that see no unmasked key
// are not compared (ParityPair::skip_rows_masked_entirely), for a rewrite that says it does not reproduce them.
inline void ExpectCacheParityOnPaddedBatches(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                                             const std::vector<CacheShape>& shapes, int presents,
                                             bool skip_rows_masked_entirely = false) {
  auto a = SessionOf(original, ORT_DISABLE_ALL);
  auto b = SessionOf(optimized, ORT_DISABLE_ALL);
  ASSERT_TRUE(a && b);
  v1::ValidationConfig config;
  config.set_atol(1e-4);
  config.set_rtol(0);
  config.set_samples(2);
  config.set_mask_padding(0.4);
  for (const CacheShape& shape : shapes) {
    auto* dims = config.add_shapes()->mutable_dim_values();
    (*dims)["batch"] = shape.batch;
    (*dims)["past_sequence"] = shape.past;
    (*dims)["sequence"] = shape.sequence;
  }
  v1::ParityReport report;
  ParityPair pair{*a, original, *b};
  pair.skip_rows_masked_entirely = skip_rows_masked_entirely;
  absl::Status status = CheckParity(pair, config, {}, RunContext(), &report);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(report.passed()) << report.DebugString();
  EXPECT_EQ(report.rows_masked_entirely_skipped(), skip_rows_masked_entirely);
  EXPECT_EQ(report.outputs_size(), static_cast<int>(2 * shapes.size() * (1 + presents)))
      << "logits and every present, each shape";
}

// The greedy generation of both (batch 2, one row padded on the left, a 12-token prompt, `steps`
// tokens), each step teacher-forced: the report, after checking every token is the same.
inline v1::GenerationReport ExpectIdenticalGreedyGeneration(const onnx::ModelProto& original,
                                                            const onnx::ModelProto& optimized, int steps) {
  v1::GenerationReport report;
  auto a = SessionOf(original, ORT_DISABLE_ALL);
  auto b = SessionOf(optimized, ORT_DISABLE_ALL);
  const std::optional<CacheInterface> cache = FindCacheInterface(original.graph());
  EXPECT_TRUE(a && b && cache.has_value());
  if (!a || !b || !cache) return report;
  v1::GenerationConfig settings;
  settings.set_greedy_tokens(steps);
  settings.set_prompt_tokens(12);
  absl::StatusOr<v1::GenerationConfig> config = ResolveGenerationConfig(settings);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return report;
  absl::Status status = CompareGreedyGeneration(*a, *b, original, *cache, *config, /*exact_tokens=*/true, &report);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(report.passed()) << report.DebugString();
  EXPECT_EQ(report.steps_size(), steps);
  EXPECT_EQ(report.identical_steps(), steps);
  EXPECT_GT(report.min_logits_cosine(), 0.99999);
  EXPECT_LT(report.max_kl_divergence(), 1e-6) << "the same distributions, token after token";
  return report;
}

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_CACHE_DECODER_CHECKS_H_
