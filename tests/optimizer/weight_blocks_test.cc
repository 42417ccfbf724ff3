// Block-wise weight quantization (weight_blocks.h): the MatMulNBits layout round-trips, 8-bit blocks
// are finer than 4-bit ones, and HQQ never reconstructs a weight worse than round-to-nearest and
// does better on weights with the heavy tails trained ones have.
#include "optimizer/passes/precision/weight_blocks.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace onnxopt {
namespace {

FloatWeight RandomWeight(int64_t k, int64_t n, bool heavy_tailed, uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::student_t_distribution<float> student(3.0f);
  FloatWeight weight;
  weight.k = k;
  weight.n = n;
  weight.values.resize(static_cast<size_t>(k * n));
  for (float& value : weight.values) value = heavy_tailed ? 0.01f * student(random) : normal(random);
  return weight;
}

double RelativeError(const FloatWeight& weight, const std::vector<float>& approx) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < approx.size(); ++i) {
    error += (approx[i] - weight.values[i]) * (approx[i] - weight.values[i]);
    norm += weight.values[i] * weight.values[i];
  }
  return std::sqrt(error / norm);
}

double ErrorOf(const FloatWeight& weight, const BlockQuantization& how) {
  std::optional<BlockQuantized> blocks = QuantizeBlocks(weight, how);
  EXPECT_TRUE(blocks.has_value());
  return blocks ? RelativeError(weight, DequantizeBlocks(*blocks, weight.k, weight.n, how)) : 1.0;
}

TEST(WeightBlocksTest, SymmetricBlockMapsItsLargestMagnitudeToTheEndLevel) {
  // One column, one block of 16: the largest magnitude (-8) is level 0, so scale = 1, zero point 8.
  FloatWeight weight;
  weight.k = 16;
  weight.n = 1;
  for (int i = 0; i < 16; ++i) weight.values.push_back(static_cast<float>(i % 2 == 0 ? i / 2 : -i / 2 - 1));
  BlockQuantization how;
  how.block = 16;
  std::optional<BlockQuantized> blocks = QuantizeBlocks(weight, how);
  ASSERT_TRUE(blocks.has_value());
  ASSERT_EQ(blocks->scales.size(), 1u);
  EXPECT_FLOAT_EQ(blocks->scales[0], 1.0f);
  EXPECT_TRUE(blocks->zero_points.empty());
  ASSERT_EQ(blocks->packed.size(), 8u);
  // Weights 0 and -1: levels 8 and 7, the first in the low nibble.
  EXPECT_EQ(static_cast<uint8_t>(blocks->packed[0]), 8 | (7 << 4));
  EXPECT_EQ(DequantizeBlocks(*blocks, 16, 1, how), weight.values) << "integers within range are exact";
}

TEST(WeightBlocksTest, PaddedBlocksAndAsymmetricZeroPointsRoundTrip) {
  const FloatWeight weight = RandomWeight(/*k=*/80, /*n=*/5, /*heavy_tailed=*/false, 1);  // 80 = 2.5 blocks of 32
  for (bool symmetric : {true, false}) {
    BlockQuantization how;
    how.symmetric = symmetric;
    std::optional<BlockQuantized> blocks = QuantizeBlocks(weight, how);
    ASSERT_TRUE(blocks.has_value());
    EXPECT_EQ(blocks->blocks, 3);
    EXPECT_EQ(blocks->packed.size(), 5u * 3 * 16);
    EXPECT_EQ(blocks->zero_points.size(), symmetric ? 0u : 5u * 2);
    const std::vector<float> approx = DequantizeBlocks(*blocks, 80, 5, how);
    ASSERT_EQ(approx.size(), weight.values.size());
    EXPECT_LT(RelativeError(weight, approx), 0.15) << "symmetric " << symmetric;
  }
}

TEST(WeightBlocksTest, EightBitBlocksAreAboutSixteenTimesFiner) {
  const FloatWeight weight = RandomWeight(256, 64, false, 2);
  BlockQuantization four, eight;
  eight.bits = 8;
  const double error4 = ErrorOf(weight, four), error8 = ErrorOf(weight, eight);
  EXPECT_LT(error8 * 8, error4) << "int4 " << error4 << ", int8 " << error8;
  std::optional<BlockQuantized> blocks = QuantizeBlocks(weight, eight);
  ASSERT_TRUE(blocks.has_value());
  EXPECT_EQ(blocks->packed.size(), 256u * 64) << "one byte a weight";
}

TEST(WeightBlocksTest, HalfQuadraticNeverLosesToRoundToNearestAndWinsOnHeavyTails) {
  for (bool heavy_tailed : {false, true}) {
    const FloatWeight weight = RandomWeight(512, 96, heavy_tailed, 3);
    for (int64_t block : {32, 128}) {
      BlockQuantization rtn, hqq;
      rtn.symmetric = hqq.symmetric = false;
      rtn.block = hqq.block = block;
      hqq.method = BlockMethod::kHalfQuadratic;
      const double rtn_error = ErrorOf(weight, rtn), hqq_error = ErrorOf(weight, hqq);
      EXPECT_LE(hqq_error, rtn_error) << "heavy tails " << heavy_tailed << ", block " << block;
      if (heavy_tailed) {
        EXPECT_LT(hqq_error, rtn_error * 0.98) << "block " << block << ": rtn " << rtn_error << ", hqq " << hqq_error;
      }
    }
  }
}

TEST(WeightBlocksTest, NonFiniteWeightsAreRefused) {
  FloatWeight weight = RandomWeight(32, 2, false, 4);
  weight.values[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(QuantizeBlocks(weight, BlockQuantization{}).has_value());
}

}  // namespace
}  // namespace onnxopt
