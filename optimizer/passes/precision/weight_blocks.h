// Block-wise weight quantization in ONNX Runtime's MatMulNBits layout, and its inverse: what the
// int4 pass writes, and what the report's error figures are computed from.
//
// A weight W[K, N] is cut, per output column, into blocks of `block` values along K (K zero-padded
// to a multiple). Each block has a scale s and a zero point z, and a weight is stored as a level
// q in [0, 2^bits): W ~ s * (q - z).
//   Round to nearest ("rtn"): symmetric: z = 2^(bits-1), s from the largest magnitude; asymmetric: the
//     block's range widened to hold 0, s = (max - min) / (2^bits - 1), z = round(-min / s).
//   Half-quadratic ("hqq", asymmetric only): HQQ's solver (Badri & Shaji, 2023) for the zero point
//     with the scale of the range: alternate rounding with a proximal step on an l_p (p = 0.7) norm
//     of the error, which lets a few outliers stay wrong so the bulk fits better; no calibration
//     data. MatMulNBits' fast CPU kernels take integer zero points only (float ones fall back to
//     dequantizing the whole weight), so the solved zero point is rounded and the scale refitted by
//     least squares for the levels it gives. The solver starts from the block's range and from two
//     narrower ones (0.9x, 0.8x: clipping the tails, which heavy-tailed blocks reward); each block keeps
//     whichever of these and round-to-nearest reconstructs it with the smallest squared error, so the
//     method never loses to RTN on a block.
#ifndef ONNXOPT_OPTIMIZER_PASSES_PRECISION_WEIGHT_BLOCKS_H_
#define ONNXOPT_OPTIMIZER_PASSES_PRECISION_WEIGHT_BLOCKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optimizer/passes/precision/weight_products.h"

namespace onnxopt {

enum class BlockMethod { kRoundToNearest, kHalfQuadratic };

struct BlockQuantization {
  int64_t block = 32;  // 16..256, a power of two
  int bits = 4;        // 4 or 8
  bool symmetric = true;
  BlockMethod method = BlockMethod::kRoundToNearest;
};

// MatMulNBits' inputs B, scales and zero_points.
struct BlockQuantized {
  std::string packed;          // uint8 [n, blocks, block * bits / 8], the first level in the low bits
  std::vector<float> scales;   // [n * blocks]
  std::string zero_points;     // uint8 [n * ceil(blocks * bits / 8)], packed like B; empty when symmetric
  int64_t blocks = 0;          // per column
  int64_t zero_point_bytes = 0;  // per column
};

// W quantized as `how` says; nullopt when W holds NaN or Inf.
std::optional<BlockQuantized> QuantizeBlocks(const FloatWeight& weight, const BlockQuantization& how);

// What the quantized weight stands for: [k, n] row-major, as MatMulNBits dequantizes it.
std::vector<float> DequantizeBlocks(const BlockQuantized& quantized, int64_t k, int64_t n,
                                    const BlockQuantization& how);

// "rtn" or "hqq".
const char* BlockMethodName(BlockMethod method);

}  // namespace onnxopt

#endif  // ONNXOPT_OPTIMIZER_PASSES_PRECISION_WEIGHT_BLOCKS_H_
