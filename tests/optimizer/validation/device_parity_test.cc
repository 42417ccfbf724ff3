// Parity that fits the device: the reference is the original on the CPU in fp32 with ONNX Runtime's
// rewrites off; where the compared models run otherwise (a GPU, or ort_optimization_level set, which
// is how the CPU tests make a "device" that rounds differently), the original's own deviation there
// is measured per output and noise_factor times it bounds the optimized model's.
#include <cmath>
#include <filesystem>

#include "gtest/gtest.h"
#include "optimizer/optimize.h"
#include "optimizer/validation/parity.h"
#include "tests/parity_matchers.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

TEST(DeviceParityTest, AnElementOutsideToleranceIsJudgedByTheDeviceNoiseBound) {
  std::vector<float> expected = {1, 2, 3, 4};
  std::vector<float> exact = {1, 2, 3, 4};
  std::vector<float> drifted = {1, 2, 3, 4.01f};
  v1::OutputParity strict;
  CompareOutput(testing::FloatTensorValue(expected), testing::FloatTensorValue(drifted), 1e-4, 0, &strict);
  EXPECT_FALSE(strict.passed()) << "no device noise: the tolerance alone judges";
  v1::OutputParity noisy;
  CompareOutput(testing::FloatTensorValue(expected), testing::FloatTensorValue(drifted), 1e-4, 0, &noisy, 0, 0.02);
  EXPECT_TRUE(noisy.passed());
  EXPECT_EQ(noisy.judged_by(), "device noise");
  EXPECT_DOUBLE_EQ(noisy.noise_bound(), 0.02);
  v1::OutputParity beyond;
  CompareOutput(testing::FloatTensorValue(expected), testing::FloatTensorValue(drifted), 1e-4, 0, &beyond, 0, 0.005);
  EXPECT_FALSE(beyond.passed()) << "0.01 off, the device strays 0.005";
  v1::OutputParity within;
  CompareOutput(testing::FloatTensorValue(expected), testing::FloatTensorValue(exact), 1e-4, 0, &within, 0, 0.02);
  EXPECT_EQ(within.judged_by(), "tolerance");
}

// y = x W: the reference and a candidate whose weight is off by `offset` everywhere.
onnx::ModelProto Projection(float offset) {
  onnx::GraphProto graph;
  *graph.add_node() = testing::MakeNode("MatMul", {"x", "w"}, {"y"});
  std::vector<float> weights(16 * 8, 0.0f);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.01f * static_cast<float>(i % 7) + offset;
  *graph.add_initializer() = testing::FloatTensor("w", {16, 8}, weights);
  *graph.add_input() = testing::FloatValue("x", {4, 16});
  *graph.add_output() = testing::FloatValue("y", {4, 8});
  return testing::MakeModel(graph, 13);
}

TEST(DeviceParityTest, TheMeasuredDeviationWidensTheBoundByTheFactorAndNoMore) {
  const onnx::ModelProto original = Projection(0);
  SessionSettings cpu;
  cpu.optimization_level = ORT_DISABLE_ALL;
  auto reference_session = CreateSession({original.SerializeAsString(), {}}, cpu);
  ASSERT_TRUE(reference_session.ok()) << reference_session.status();
  v1::ValidationConfig config;
  v1::ParityReport report;
  auto reference = BuildParityReference(**reference_session, original, config, {}, RunContext(), &report);
  ASSERT_TRUE(reference.ok()) << reference.status();
  // A device whose original strays 0.05 (set here: the CPU's own deviation is 0).
  ASSERT_TRUE(MeasureDeviceDeviation(**reference_session, RunContext(), &*reference).ok());
  ASSERT_EQ(reference->device_deviation.size(), 1u);
  EXPECT_EQ(reference->device_deviation[0], 0) << "the same session deviates by nothing";
  reference->device_deviation[0] = 0.05;
  EXPECT_EQ(NoiseFactor(config), kDefaultNoiseFactor);

  // x is a standard normal over 16 terms: a weight offset of 1e-3 moves y by about 4e-3 (< 0.1),
  // one of 0.1 by about 0.4 (> 0.1).
  for (const auto& [offset, passes] : {std::pair{1e-3f, true}, std::pair{0.1f, false}}) {
    const onnx::ModelProto candidate = Projection(offset);
    auto session = CreateSession({candidate.SerializeAsString(), {}}, cpu);
    ASSERT_TRUE(session.ok());
    v1::ParityReport judged;
    ASSERT_TRUE(CompareWithReference(**session, "fp32", *reference, config, RunContext(), &judged).ok());
    EXPECT_EQ(judged.passed(), passes) << "offset " << offset << ": " << judged.DebugString();
    ASSERT_GT(judged.outputs_size(), 0);
    EXPECT_DOUBLE_EQ(judged.outputs(0).device_deviation(), 0.05);
    EXPECT_DOUBLE_EQ(judged.outputs(0).noise_bound(), 0.1);
    if (passes) {
      EXPECT_EQ(judged.outputs(0).judged_by(), "device noise");
    }
  }
}

TEST(DeviceParityTest, NoiseFactorOutOfRangeIsRejected) {
  v1::ValidationConfig config;
  config.set_noise_factor(0.5);
  EXPECT_EQ(CheckValidationSettings(config).code(), absl::StatusCode::kInvalidArgument);
  config.set_noise_factor(4);
  EXPECT_TRUE(CheckValidationSettings(config).ok());
}

v1::Report RunBertJob(const std::string& name, const std::function<void(v1::OptimizationConfig*)>& configure) {
  OptimizeRequest request;
  request.model_path = testing::FixturePath("hf/bert_torchscript.onnx");
  request.output_dir = testing::TempDir(name);
  request.config.set_preset(v1::Pipelines::transformer);
  request.config.mutable_benchmark()->set_skip(true);
  configure(&request.config);
  auto result = Optimize(request);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->report : v1::Report();
}

TEST(DeviceParityTest, AJobOnADeviceThatRoundsOtherwiseMeasuresTheOriginalThere) {
  // ONNX Runtime's own fusions (level all) as the "device": they round otherwise than the reference.
  const v1::Report report = RunBertJob("device_parity_all", [](v1::OptimizationConfig* config) {
    config->mutable_validation()->set_ort_optimization_level(v1::ORT_LEVEL_ALL);
    config->mutable_validation()->set_noise_factor(3);
  });
  const v1::ParityReport& parity = report.parity();
  EXPECT_TRUE(parity.passed()) << parity.DebugString();
  EXPECT_EQ(parity.reference(), "CPU fp32, ONNX Runtime optimizations disabled");
  EXPECT_EQ(parity.device(), "CPU fp32, ONNX Runtime optimizations all");
  EXPECT_EQ(parity.noise_factor(), 3);
  EXPECT_FALSE(parity.tf32());
  ASSERT_GT(parity.outputs_size(), 0);
  double largest = 0;
  for (const auto& output : parity.outputs()) {
    EXPECT_GE(output.device_deviation(), 0);
    EXPECT_DOUBLE_EQ(output.noise_bound(), 3 * output.device_deviation()) << output.name();
    EXPECT_FALSE(output.judged_by().empty()) << output.name();
    largest = std::max(largest, output.device_deviation());
  }
  EXPECT_GT(largest, 0) << "ONNX Runtime's fused kernels round otherwise than the unfused reference";
  EXPECT_LT(largest, 1e-4);
}

TEST(DeviceParityTest, OnTheCpuByDefaultTheReferenceIsTheDeviceAndNothingIsWidened) {
  const v1::Report report = RunBertJob("device_parity_cpu", [](v1::OptimizationConfig*) {});
  const v1::ParityReport& parity = report.parity();
  EXPECT_TRUE(parity.passed());
  EXPECT_EQ(parity.reference(), parity.device());
  for (const auto& output : parity.outputs()) {
    EXPECT_EQ(output.device_deviation(), 0) << output.name();
    EXPECT_EQ(output.noise_bound(), 0) << output.name();
    EXPECT_EQ(output.judged_by(), "tolerance") << output.name();
  }
}

}  // namespace
}  // namespace onnxopt
