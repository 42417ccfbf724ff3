// quantize_dynamic_int8: full-range int8 weights where the CPU has int8 dot products, 7-bit ones where
// x86's u8s8 kernels would saturate their 16-bit pair sums (reduce_range), each matching the float
// product in ONNX Runtime within a few of its quantization steps.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "gtest/gtest.h"
#include "optimizer/passes/precision/weight_products.h"
#include "tests/model_builder.h"
#include "tests/parity_matchers.h"
#include "tests/pass_runner.h"

namespace onnxopt {
namespace {

constexpr int64_t kK = 256, kN = 64;

// x [4, kK] -> MatMul(W [kK, kN]) -> y, with activations and weights far from zero (the sums that
// saturate 16 bits are the large ones).
onnx::ModelProto ProductModel() {
  onnx::GraphProto graph;
  *graph.add_input() = testing::FloatValue("x", {4, kK});
  *graph.add_initializer() = testing::FloatTensor("w", {kK, kN}, testing::RandomFloats(kK * kN, 3));
  *graph.add_node() = testing::MakeNode("MatMul", {"x", "w"}, {"y"});
  *graph.add_output() = testing::FloatValue("y", {4, kN});
  return testing::MakeModel(std::move(graph), 17);
}

// The largest magnitude among the int8 weights the pass wrote.
int LargestLevel(const onnx::ModelProto& model) {
  int largest = 0;
  for (const auto& tensor : model.graph().initializer()) {
    if (tensor.data_type() != onnx::TensorProto::INT8) continue;
    for (char byte : tensor.raw_data()) largest = std::max(largest, std::abs(static_cast<int>(static_cast<int8_t>(byte))));
  }
  return largest;
}

int64_t Counter(const v1::PassReport& report, const std::string& name) {
  auto it = report.counters().find(name);
  return it == report.counters().end() ? 0 : it->second;
}

TEST(QuantizeDynamicInt8Test, SevenBitWeightsWhereAsked) {
  const onnx::ModelProto original = ProductModel();
  testing::PassRun full = testing::RunConfig(
      R"({"passes": [{"name": "quantize_dynamic_int8", "params": {"reduce_range": "false"}}]})", original);
  ASSERT_TRUE(full.status.ok()) << full.status;
  EXPECT_EQ(testing::OpCounts(full.model)["DynamicQuantizeMatMul"], 1);
  EXPECT_EQ(LargestLevel(full.model), 127);
  EXPECT_EQ(Counter(full.report, "seven_bit_weights"), 0);

  testing::PassRun reduced = testing::RunConfig(
      R"({"passes": [{"name": "quantize_dynamic_int8", "params": {"reduce_range": "true"}}]})", original);
  ASSERT_TRUE(reduced.status.ok()) << reduced.status;
  EXPECT_EQ(LargestLevel(reduced.model), 63);
  EXPECT_EQ(Counter(reduced.report, "seven_bit_weights"), 1);
  // Sums of 256 products spread over about +-16; both forms land within 2 of them (0.6-0.8 measured:
  // the activations' uint8 step dominates), where a wrong scale would be off by the sums' own size.
  // On an AVX2-only CPU (qemu) the 7-bit model is off by 0.99 and the full-range one by 6.9: its pair sums
  // saturate, which is what reduce_range is for.
  testing::ExpectSameOutputs(original, reduced.model, 2.0, 0);
  if (CpuHasInt8DotProducts()) testing::ExpectSameOutputs(original, full.model, 2.0, 0);
}

TEST(QuantizeDynamicInt8Test, AutoFollowsTheCpusDotProducts) {
  testing::PassRun run = testing::RunPass("quantize_dynamic_int8", ProductModel());
  EXPECT_EQ(LargestLevel(run.model), CpuHasInt8DotProducts() ? 127 : 63);
}

TEST(QuantizeDynamicInt8Test, AnUnknownReduceRangeIsRefused) {
  testing::PassRun run = testing::RunConfig(
      R"({"passes": [{"name": "quantize_dynamic_int8", "params": {"reduce_range": "sometimes"}}]})", ProductModel());
  ASSERT_FALSE(run.status.ok());
  EXPECT_NE(run.status.message().find("reduce_range"), std::string::npos) << run.status;
}

}  // namespace
}  // namespace onnxopt
