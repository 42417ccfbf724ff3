// precision.mode "auto": every candidate validated and timed on the job's device, the fastest that
// passes returned, all of them in the report.
#include <filesystem>

#include "gtest/gtest.h"
#include "optimizer/optimize.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

TEST(AutoPrecisionTest, EveryCandidateIsReportedAndTheFastestPassingOneIsReturned) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("bert_tiny.onnx");
  request.output_dir = testing::TempDir("auto_precision");
  request.config.set_preset(v1::Pipelines::transformer);
  request.config.mutable_precision()->set_mode(v1::PrecisionConfig::auto_);
  request.config.mutable_benchmark()->set_time_budget_seconds(3);
  auto result = Optimize(request);
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::PrecisionReport& precision = result->report.precision();
  EXPECT_EQ(precision.mode(), "auto");
  ASSERT_EQ(precision.candidates_size(), 2) << "fp32 and fp16; bf16 on CUDA only";
  EXPECT_EQ(precision.candidates(0).mode(), "fp32");
  EXPECT_EQ(precision.candidates(1).mode(), "fp16");
  const v1::PrecisionCandidate* chosen = nullptr;
  for (const auto& candidate : precision.candidates()) {
    if (candidate.chosen()) {
      EXPECT_EQ(chosen, nullptr) << "one chosen";
      chosen = &candidate;
    }
    if (!candidate.passed()) {
      EXPECT_FALSE(candidate.note().empty()) << candidate.mode();
    }
  }
  ASSERT_NE(chosen, nullptr);
  EXPECT_TRUE(chosen->passed());
  for (const auto& candidate : precision.candidates()) {
    if (candidate.passed()) {
      EXPECT_LE(candidate.speedup(), chosen->speedup()) << candidate.mode();
    }
  }
  EXPECT_DOUBLE_EQ(precision.candidates(0).speedup(), 1.0);
  EXPECT_GT(precision.candidates(0).p50_ms(), 0);
  EXPECT_EQ(precision.precision(), chosen->mode()) << "the returned model is the chosen one";
  EXPECT_TRUE(result->report.parity().passed());
  EXPECT_NE(precision.note().find(chosen->mode()), std::string::npos) << precision.note();
}

TEST(AutoPrecisionTest, ItNeedsValidation) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("bert_tiny.onnx");
  request.output_dir = testing::TempDir("auto_precision_unvalidated");
  request.config.mutable_precision()->set_mode(v1::PrecisionConfig::auto_);
  request.config.mutable_validation()->set_skip(true);
  auto result = Optimize(request);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("auto"), std::string::npos) << result.status();
}

}  // namespace
}  // namespace onnxopt
