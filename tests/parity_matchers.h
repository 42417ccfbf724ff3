// Numerical proof for rewrites: both models run in ONNX Runtime on the same generated inputs.
#ifndef ONNXOPT_TESTS_PARITY_MATCHERS_H_
#define ONNXOPT_TESTS_PARITY_MATCHERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/parity.h"
#include "optimizer/validation/benchmark.h"
#include "optimizer/validation/input_generator.h"

namespace onnxopt::testing {

// A CPU session of `model`; null (and a test failure) when it cannot be made. ORT_DISABLE_ALL runs the
// graph as written, without ONNX Runtime's own fusions.
inline std::unique_ptr<Ort::Session> SessionOf(const onnx::ModelProto& model,
                                               GraphOptimizationLevel level = ORT_ENABLE_ALL) {
  SessionSettings settings;
  settings.optimization_level = level;
  auto session = CreateSession({model.SerializeAsString(), {}}, settings);
  EXPECT_TRUE(session.ok()) << session.status();
  return session.ok() ? *std::move(session) : nullptr;
}

// A 1-D float tensor over `data` (which must outlive it).
inline Ort::Value FloatTensorValue(std::vector<float>& data) {
  static Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const int64_t shape[] = {static_cast<int64_t>(data.size())};
  return Ort::Value::CreateTensor<float>(memory, data.data(), data.size(), shape, 1);
}

// Fails the test unless `optimized` reproduces `original`'s outputs within atol/rtol.
inline void ExpectSameOutputs(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                              double atol = 1e-5, double rtol = 1e-5) {
  SessionSettings settings;
  settings.optimization_level = ORT_DISABLE_ALL;  // compare the graphs as written
  auto a = CreateSession({original.SerializeAsString(), {}}, settings);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = CreateSession({optimized.SerializeAsString(), {}}, settings);
  ASSERT_TRUE(b.ok()) << b.status();
  v1::ValidationConfig config;
  config.set_atol(atol);
  config.set_rtol(rtol);
  config.set_samples(2);
  v1::ParityReport report;
  absl::Status status = CheckParity({**a, original, **b}, config, {}, RunContext(), &report);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(report.passed()) << report.DebugString();
}

// Fails the test unless `optimized` reproduces `original` within 1e-4 absolute (rtol 0), both graphs
// as written, on `batch` rows with masks padded to a different length per row, two samples, at each
// of `sequences` (none: the inputs' own lengths).
inline void ExpectParityOnPaddedBatches(const onnx::ModelProto& original, const onnx::ModelProto& optimized,
                                        int64_t batch, const std::vector<int64_t>& sequences,
                                        v1::ParityReport* report) {
  SessionSettings settings;
  settings.optimization_level = ORT_DISABLE_ALL;
  auto a = CreateSession({original.SerializeAsString(), {}}, settings);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = CreateSession({optimized.SerializeAsString(), {}}, settings);
  ASSERT_TRUE(b.ok()) << b.status();
  v1::ValidationConfig config;
  config.set_atol(1e-4);
  config.set_rtol(0);
  config.set_samples(2);
  config.set_mask_padding(0.4);
  (*config.mutable_dim_values())["batch"] = batch;
  for (int64_t sequence : sequences) (*config.add_shapes()->mutable_dim_values())["sequence"] = sequence;
  absl::Status status = CheckParity({**a, original, **b}, config, {}, RunContext(), report);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(report->passed()) << report->DebugString();
}

// Fails the test unless masking half the positions of `model`'s generated masks changes its first
// output (parity alone would pass if neither model looked at the mask). `original` gives the inputs.
inline void ExpectPaddingChangesTheOutput(const onnx::ModelProto& model, const onnx::ModelProto& original) {
  auto session = CreateSession({model.SerializeAsString(), {}}, SessionSettings());
  ASSERT_TRUE(session.ok()) << session.status();
  v1::ValidationConfig full, padded;
  full.set_mask_padding(0);  // all ones (unset means padded)
  padded.set_mask_padding(0.5);
  v1::ParityReport ignored;
  auto unmasked = BuildParityReference(**session, original, full, {}, RunContext(), &ignored);
  auto masked = BuildParityReference(**session, original, padded, {}, RunContext(), &ignored);
  ASSERT_TRUE(unmasked.ok() && masked.ok());
  v1::OutputParity difference;
  CompareOutput(unmasked->sets[0].expected[0], masked->sets[0].expected[0], 1e-6, 0, &difference);
  EXPECT_FALSE(difference.passed()) << "masking half the positions changes the output";
}

// Fails the test unless `actual` gives `expected`'s float outputs bit for bit on inputs generated for
// `model` (the same model, handed to ONNX Runtime another way), both graphs as written.
inline void ExpectBitIdenticalOutputs(const ModelSource& expected, const ModelSource& actual,
                                      const onnx::ModelProto& model) {
  SessionSettings settings;
  settings.optimization_level = ORT_DISABLE_ALL;
  auto a = CreateSession(expected, settings);
  auto b = CreateSession(actual, settings);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  auto inputs = GenerateInputs(**a, model, v1::ValidationConfig(), 0);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  auto x = RunOnInputs(**a, *inputs, OutputNames(**a));
  auto y = RunOnInputs(**b, *inputs, OutputNames(**b));
  ASSERT_TRUE(x.ok() && y.ok()) << y.status();
  ASSERT_EQ(x->size(), y->size());
  for (size_t i = 0; i < x->size(); ++i) {
    const auto count = (*x)[i].GetTensorTypeAndShapeInfo().GetElementCount();
    const float* want = (*x)[i].GetTensorData<float>();
    const float* got = (*y)[i].GetTensorData<float>();
    for (size_t j = 0; j < count; ++j) ASSERT_EQ(want[j], got[j]) << "output " << i << ", element " << j;
  }
}

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_PARITY_MATCHERS_H_
