#include "optimizer/passes/precision/weight_blocks.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace onnxopt {
namespace {

// HQQ's published defaults (hqq/core/optimize.py): l_p norm, penalty, its growth, iterations.
constexpr float kHqqNorm = 0.7f;
constexpr float kHqqBeta = 10.0f;
constexpr float kHqqKappa = 1.01f;
constexpr int kHqqIterations = 20;
constexpr int kScaleRefits = 2;
constexpr float kHqqRangeStarts[] = {1.0f, 0.9f, 0.8f};

struct BlockFit {
  float scale = 1.0f;
  int zero = 0;
};

int Level(float w, const BlockFit& fit, int top) {
  return static_cast<int>(std::clamp(std::nearbyint(w / fit.scale) + static_cast<float>(fit.zero), 0.0f,
                                     static_cast<float>(top)));
}

double SquaredError(const float* w, int64_t m, const BlockFit& fit, int top) {
  double error = 0;
  for (int64_t i = 0; i < m; ++i) {
    const double d = w[i] - fit.scale * static_cast<float>(Level(w[i], fit, top) - fit.zero);
    error += d * d;
  }
  return error;
}

BlockFit RoundToNearest(const float* w, int64_t m, int bits, bool symmetric) {
  const int top = (1 << bits) - 1;
  BlockFit fit{1.0f, 1 << (bits - 1)};
  float largest = 0.0f, low = 0.0f, high = 0.0f;
  for (int64_t i = 0; i < m; ++i) {
    if (std::fabs(w[i]) > std::fabs(largest)) largest = w[i];
    low = std::min(low, w[i]);
    high = std::max(high, w[i]);
  }
  if (symmetric) {
    // The largest magnitude lands on the end level: q = 0 for it, whatever its sign.
    if (largest != 0.0f) fit.scale = -largest / static_cast<float>(1 << (bits - 1));
  } else if (high > low) {
    fit.scale = (high - low) / static_cast<float>(top);
    fit.zero = static_cast<int>(std::clamp(std::nearbyint(-low / fit.scale), 0.0f, static_cast<float>(top)));
  }
  return fit;
}

// HQQ's zero-point solver with the scale of [low, high], then the integer zero point and the
// least-squares scale for the levels it gives.
BlockFit HalfQuadratic(const float* w, int64_t m, int bits, float low, float high) {
  const int top = (1 << bits) - 1;
  const float inverse = static_cast<float>(top) / (high - low);
  float zero = -low * inverse, best_zero = zero;
  double best_error = std::numeric_limits<double>::infinity();
  float beta = kHqqBeta;
  for (int iteration = 0; iteration < kHqqIterations; ++iteration) {
    double error = 0, next_zero = 0;
    for (int64_t i = 0; i < m; ++i) {
      const float q = std::clamp(std::nearbyint(w[i] * inverse + zero), 0.0f, static_cast<float>(top));
      const float d = w[i] - (q - zero) / inverse;
      const float magnitude = std::fabs(d);
      // The proximal operator of |.|^p: shrink the residual, more for small ones.
      const float shrunk =
          magnitude > 0.0f ? std::copysign(std::max(magnitude - std::pow(magnitude, kHqqNorm - 1.0f) / beta, 0.0f), d)
                           : 0.0f;
      next_zero += q - (w[i] - shrunk) * inverse;
      error += magnitude;
    }
    if (error >= best_error) break;
    best_error = error;
    best_zero = zero;
    zero = static_cast<float>(next_zero / static_cast<double>(m));
    beta *= kHqqKappa;
  }
  BlockFit fit{1.0f / inverse, static_cast<int>(std::clamp(std::nearbyint(best_zero), 0.0f, static_cast<float>(top)))};
  for (int refit = 0; refit < kScaleRefits; ++refit) {
    double numerator = 0, denominator = 0;
    for (int64_t i = 0; i < m; ++i) {
      const double level = Level(w[i], fit, top) - fit.zero;
      numerator += w[i] * level;
      denominator += level * level;
    }
    if (!(denominator > 0) || !(numerator > 0)) break;
    fit.scale = static_cast<float>(numerator / denominator);
  }
  return fit;
}

BlockFit Fit(const float* w, int64_t m, const BlockQuantization& how) {
  const BlockFit nearest = RoundToNearest(w, m, how.bits, how.symmetric);
  if (how.method == BlockMethod::kRoundToNearest || how.symmetric) return nearest;
  const int top = (1 << how.bits) - 1;
  const auto [low_it, high_it] = std::minmax_element(w, w + m);
  if (!(*high_it > *low_it)) return nearest;
  BlockFit best = nearest;
  double best_error = SquaredError(w, m, nearest, top);
  // HQQ starts from the block's range; narrower starts let the solver clip the tails, which heavy-tailed
  // blocks reward. The block keeps the start whose result reconstructs it best.
  for (float shrink : kHqqRangeStarts) {
    const BlockFit solved = HalfQuadratic(w, m, how.bits, *low_it * shrink, *high_it * shrink);
    const double error = SquaredError(w, m, solved, top);
    if (error < best_error) {
      best = solved;
      best_error = error;
    }
  }
  return best;
}

void PutLevel(std::string& bytes, int64_t byte_offset, int64_t index, int bits, int level) {
  uint8_t& byte = reinterpret_cast<uint8_t&>(bytes[static_cast<size_t>(byte_offset + index * bits / 8)]);
  byte |= static_cast<uint8_t>(level << ((index * bits) % 8));
}

int GetLevel(const std::string& bytes, int64_t byte_offset, int64_t index, int bits) {
  const auto byte = static_cast<uint8_t>(bytes[static_cast<size_t>(byte_offset + index * bits / 8)]);
  return (byte >> ((index * bits) % 8)) & ((1 << bits) - 1);
}

}  // namespace

const char* BlockMethodName(BlockMethod method) {
  return method == BlockMethod::kHalfQuadratic ? "hqq" : "rtn";
}

std::optional<BlockQuantized> QuantizeBlocks(const FloatWeight& weight, const BlockQuantization& how) {
  const int64_t k = weight.k, n = weight.n, block = how.block;
  const int top = (1 << how.bits) - 1;
  BlockQuantized out;
  out.blocks = (k + block - 1) / block;
  const int64_t blob = block * how.bits / 8;
  out.zero_point_bytes = (out.blocks * how.bits + 7) / 8;
  out.packed.assign(static_cast<size_t>(n * out.blocks * blob), '\0');
  out.scales.resize(static_cast<size_t>(n * out.blocks));
  if (!how.symmetric) out.zero_points.assign(static_cast<size_t>(n * out.zero_point_bytes), '\0');
  std::vector<float> column(static_cast<size_t>(block));
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t b = 0; b < out.blocks; ++b) {
      const int64_t begin = b * block, m = std::min(k, begin + block) - begin;
      for (int64_t i = 0; i < m; ++i) {
        column[i] = weight.values[(begin + i) * n + col];
        if (!std::isfinite(column[i])) return std::nullopt;
      }
      const BlockFit fit = Fit(column.data(), m, how);
      out.scales[col * out.blocks + b] = fit.scale;
      if (!how.symmetric) PutLevel(out.zero_points, col * out.zero_point_bytes, b, how.bits, fit.zero);
      // Padding rows (beyond K) hold the zero point: they dequantize to 0.
      for (int64_t i = 0; i < block; ++i) {
        const int level = i < m ? Level(column[i], fit, top) : fit.zero;
        PutLevel(out.packed, (col * out.blocks + b) * blob, i, how.bits, level);
      }
    }
  }
  return out;
}

std::vector<float> DequantizeBlocks(const BlockQuantized& quantized, int64_t k, int64_t n,
                                    const BlockQuantization& how) {
  const int64_t blob = how.block * how.bits / 8;
  std::vector<float> values(static_cast<size_t>(k * n));
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t b = 0; b < quantized.blocks; ++b) {
      const float scale = quantized.scales[col * quantized.blocks + b];
      const int zero = how.symmetric ? 1 << (how.bits - 1)
                                     : GetLevel(quantized.zero_points, col * quantized.zero_point_bytes, b, how.bits);
      for (int64_t i = 0; i < how.block && b * how.block + i < k; ++i) {
        const int level = GetLevel(quantized.packed, (col * quantized.blocks + b) * blob, i, how.bits);
        values[(b * how.block + i) * n + col] = scale * static_cast<float>(level - zero);
      }
    }
  }
  return values;
}

}  // namespace onnxopt
