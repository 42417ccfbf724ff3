// Numerical proof for rewrites: both models run in ONNX Runtime on the same generated inputs.
#ifndef ONNXOPT_TESTS_PARITY_MATCHERS_H_
#define ONNXOPT_TESTS_PARITY_MATCHERS_H_

#include <string>

#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "optimizer/ort_runtime.h"
#include "optimizer/validation/parity.h"
#include "optimizer/validation/benchmark.h"

namespace onnxopt::testing {

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
  absl::Status status = CheckParity(**a, **b, original, config, nullptr, &report);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(report.passed()) << report.DebugString();
}

}  // namespace onnxopt::testing

#endif  // ONNXOPT_TESTS_PARITY_MATCHERS_H_
