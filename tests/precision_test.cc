// Lower precision end to end through Optimize(): float16 conversion judged in ONNX Runtime,
// automatic mixed precision on a model whose residual stream overflows float16, int8 dynamic and
// int4 weight-only quantization with their size and agreement figures, block lists, and configs
// that are refused. Plus the float16 arithmetic the conversion relies on.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optimizer/model_io.h"
#include "optimizer/optimize.h"
#include "optimizer/passes/precision/precision_common.h"
#include "optimizer/precision.h"
#include "tests/model_builder.h"

namespace onnxopt {
namespace {

namespace fs = std::filesystem;
using testing::FixturePath;

absl::StatusOr<OptimizeResult> OptimizeWith(const std::string& fixture, const std::string& mode,
                                            const std::string& dir_name,
                                            const std::function<void(v1::OptimizationConfig&)>& adjust = nullptr) {
  OptimizeRequest request;
  request.model_path = FixturePath(fixture);
  request.output_dir = testing::TempDir(absl::StrCat("precision_", dir_name)) / "out";
  request.config.mutable_precision()->set_mode(mode);
  request.config.mutable_benchmark()->set_skip(true);
  if (adjust) adjust(request.config);
  return Optimize(request);
}

int64_t OpCount(const v1::Report& report, const std::string& op) {
  auto it = report.optimized().op_histogram().find(op);
  return it == report.optimized().op_histogram().end() ? 0 : it->second;
}

TEST(Float16Test, RoundsToNearestEvenAndClampsIntoRange) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00) << "beyond the range without clamping: infinity";
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00) << "a tie rounds to even";
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(FloatToHalf(5.9604645e-08f), 0x0001) << "the smallest subnormal";
  for (float value : {0.1f, -3.14159f, 1234.5f, 6.1e-5f, 2.0e-7f}) {
    EXPECT_NEAR(HalfToFloat(FloatToHalf(value)), value, std::fabs(value) * 1e-3 + 6e-8) << value;
  }
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(-2.0f), 0xc000);

  onnx::TensorProto tensor;
  tensor.set_name("w");
  tensor.set_data_type(onnx::TensorProto::FLOAT);
  tensor.add_dims(4);
  for (float value : {1e6f, -1e6f, 1e-9f, 0.5f}) tensor.add_float_data(value);
  int64_t clamped = 0;
  onnx::TensorProto half = ConvertFloatTensor(tensor, onnx::TensorProto::FLOAT16, &clamped);
  EXPECT_EQ(clamped, 3) << "two beyond ±65504, one below the smallest subnormal";
  ASSERT_EQ(half.raw_data().size(), 8u);
  EXPECT_EQ(half.data_type(), onnx::TensorProto::FLOAT16);
  uint16_t first;
  std::memcpy(&first, half.raw_data().data(), 2);
  EXPECT_EQ(first, 0x7bff) << "clamped to 65504, not infinity";
}

TEST(PrecisionConfigTest, UnknownAndUnbuiltModesAreRefused) {
  v1::OptimizationConfig config;
  config.mutable_precision()->set_mode("fp8");
  absl::Status status = CheckConfig(config);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("int4_weight_only"), std::string::npos) << status << ": names the known modes";
  config.mutable_precision()->set_mode("int8_static");
  EXPECT_EQ(CheckConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config.mutable_precision()->set_mode("int4_weight_only");
  config.mutable_precision()->mutable_int4()->set_block_size(48);
  EXPECT_EQ(CheckConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config.mutable_precision()->mutable_int4()->set_block_size(128);
  EXPECT_TRUE(CheckConfig(config).ok());
  config.mutable_validation()->set_min_cosine_similarity(1.5);
  EXPECT_EQ(CheckConfig(config).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrecisionTest, Fp16BertPassesParityAtHalfTheSizeWithFloatInterface) {
  auto result = OptimizeWith("transformers/bert_opset17.onnx", "fp16", "fp16_bert");
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::Report& report = result->report;
  EXPECT_TRUE(report.parity().passed());
  EXPECT_EQ(report.parity().precision(), "fp16");
  EXPECT_EQ(report.precision().precision(), "fp16");
  EXPECT_LT(report.precision().size_after_bytes(), report.precision().size_before_bytes() * 0.6);
  EXPECT_GT(OpCount(report, "com.microsoft::Attention"), 0) << "fused operators are converted, not undone";
  for (const auto& output : report.parity().outputs()) EXPECT_GT(output.cosine_similarity(), 0.9999) << output.name();
  auto saved = LoadModel(result->files.front());
  ASSERT_TRUE(saved.ok());
  for (const auto& value : saved->graph().input()) {
    if (value.name() == "input_ids") {
      EXPECT_EQ(value.type().tensor_type().elem_type(), onnx::TensorProto::INT64);
    }
  }
  for (const auto& value : saved->graph().output()) {
    EXPECT_EQ(value.type().tensor_type().elem_type(), onnx::TensorProto::FLOAT) << "keep_io_types by default";
  }
  int fp16_initializers = 0;
  for (const auto& tensor : saved->graph().initializer()) fp16_initializers += tensor.data_type() == onnx::TensorProto::FLOAT16;
  EXPECT_GT(fp16_initializers, 10);
}

TEST(PrecisionTest, BlockedOpsStayFloat32BehindCasts) {
  auto result = OptimizeWith("transformers/bert_opset17.onnx", "fp16", "fp16_blocked", [](v1::OptimizationConfig& c) {
    c.mutable_precision()->add_op_block_list("MatMul");
    c.mutable_precision()->set_keep_io_types(false);
  });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->report.parity().passed());
  int kept_matmuls = 0;
  for (const auto& kept : result->report.precision().kept_nodes()) {
    if (kept.op_type() == "MatMul") {
      ++kept_matmuls;
      EXPECT_EQ(kept.reason(), "op block list");
    }
  }
  EXPECT_GT(kept_matmuls, 0);
  auto saved = LoadModel(result->files.front());
  ASSERT_TRUE(saved.ok());
  for (const auto& node : saved->graph().node()) {
    if (node.op_type() != "MatMul") continue;
    for (const auto& tensor : saved->graph().initializer()) {
      if (tensor.name() == node.input(1)) {
        EXPECT_EQ(tensor.data_type(), onnx::TensorProto::FLOAT) << node.name();
      }
    }
  }
  for (const auto& value : saved->graph().output()) {
    EXPECT_EQ(value.type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16) << "keep_io_types off";
  }
}

TEST(PrecisionTest, AutomaticMixedPrecisionKeepsTheOverflowingStreamInFloat32) {
  // Without the search the float16 model produces NaN and the float32 model is returned.
  auto plain = OptimizeWith("fp16_overflow.onnx", "fp16", "overflow_plain",
                            [](v1::OptimizationConfig& c) { c.mutable_precision()->set_auto_mixed(false); });
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->report.precision().precision(), "fp32");
  EXPECT_NE(plain->report.precision().note().find("NaN/Inf introduced"), std::string::npos)
      << plain->report.precision().note();
  EXPECT_TRUE(plain->report.parity().passed()) << "the float32 fallback passes";

  auto mixed = OptimizeWith("fp16_overflow.onnx", "fp16", "overflow_mixed");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  const v1::PrecisionReport& precision = mixed->report.precision();
  EXPECT_TRUE(mixed->report.parity().passed());
  EXPECT_EQ(precision.precision(), "fp16");
  EXPECT_GE(precision.auto_mixed_attempts(), 1);
  int overflow = 0;
  for (const auto& kept : precision.kept_nodes()) overflow += kept.reason().rfind("overflow", 0) == 0;
  EXPECT_GT(overflow, 0);
  EXPECT_LT(precision.kept_nodes_size(), 10) << "a small set, not the whole graph";
  EXPECT_GT(precision.converted_nodes(), 5) << "the rest stays float16";

  // Failing instead of recovering names the mode.
  auto failed = OptimizeWith("fp16_overflow.onnx", "fp16", "overflow_fail", [](v1::OptimizationConfig& c) {
    c.mutable_precision()->set_auto_mixed(false);
    c.mutable_validation()->set_on_parity_failure(v1::ON_PARITY_FAILURE_FAIL);
  });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(failed.status().message().find("precision mode 'fp16'"), std::string::npos) << failed.status();
}

TEST(PrecisionTest, Int8DynamicQuantizesMatMulsAndAttentionWeights) {
  auto result = OptimizeWith("transformers/bert_opset17.onnx", "int8_dynamic", "int8_bert");
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::Report& report = result->report;
  EXPECT_TRUE(report.parity().passed());
  EXPECT_EQ(report.parity().precision(), "int8");
  EXPECT_EQ(OpCount(report, "MatMul"), 0);
  EXPECT_GT(OpCount(report, "com.microsoft::DynamicQuantizeMatMul"), 0);
  EXPECT_EQ(OpCount(report, "com.microsoft::Attention"), 0) << "its packed weights are quantized too";
  EXPECT_GT(OpCount(report, "com.microsoft::MultiHeadAttention"), 0);
  const v1::PrecisionReport& precision = report.precision();
  EXPECT_LT(precision.weight_bytes_after(), precision.weight_bytes_before() * 0.3);
  for (const auto& output : report.parity().outputs()) EXPECT_GT(output.cosine_similarity(), 0.99) << output.name();
}

TEST(PrecisionTest, Int4WeightOnlyDecoderKeepsAQuarterOfTheWeightBytes) {
  auto result = OptimizeWith("transformers/gpt2_opset17.onnx", "int4_weight_only", "int4_gpt2",
                             [](v1::OptimizationConfig& c) { c.mutable_precision()->mutable_int4()->set_block_size(32); });
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::Report& report = result->report;
  EXPECT_TRUE(report.parity().passed());
  EXPECT_EQ(report.parity().precision(), "int4");
  EXPECT_GT(OpCount(report, "com.microsoft::MatMulNBits"), 0);
  const v1::PrecisionReport& precision = report.precision();
  EXPECT_LE(precision.weight_bytes_after(), precision.weight_bytes_before() * 0.25);
  for (const auto& output : report.parity().outputs()) EXPECT_GE(output.cosine_similarity(), 0.98) << output.name();

  // Asymmetric blocks (zero points) pass too.
  auto asymmetric = OptimizeWith("transformers/gpt2_opset17.onnx", "int4_weight_only", "int4_gpt2_asym",
                                 [](v1::OptimizationConfig& c) { c.mutable_precision()->mutable_int4()->set_symmetric(false); });
  ASSERT_TRUE(asymmetric.ok()) << asymmetric.status();
  EXPECT_TRUE(asymmetric->report.parity().passed());
  EXPECT_GT(OpCount(asymmetric->report, "com.microsoft::MatMulNBits"), 0);
}

TEST(PrecisionTest, Bf16WithoutCpuKernelsIsGivenUpWithTheReason) {
  auto result = OptimizeWith("fp16_overflow.onnx", "bf16", "bf16");
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::PrecisionReport& precision = result->report.precision();
  EXPECT_TRUE(result->report.parity().passed());
  if (precision.precision() == "fp32") {
    EXPECT_NE(precision.note().find("no bf16 kernel for"), std::string::npos) << precision.note();
  } else {
    EXPECT_EQ(precision.precision(), "bf16");
  }
}

}  // namespace
}  // namespace onnxopt
