// Test helper: whether two differing 4-bit codes are an allowed CPU/CUDA (or CPU/bitsandbytes)
// difference, i.e. neighbours in value order whose decision boundary the scaled input touches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/codebooks_4bit.h"
#include "kernels/quantize_4bit.h"

namespace qlora::kernels {

// The decision boundary between two codes that are neighbours in value order, or NaN when
// they are not neighbours (a real mismatch).
inline float BoundaryBetween(QuantType type, int a, int b) {
  if (type == QuantType::kNF4) {
    if (std::abs(a - b) != 1) return NAN;
    return kNf4Thresholds.v[std::min(a, b)];
  }
  if ((a & 8) != (b & 8)) return NAN;
  // FP4 magnitudes in ascending order and the pivot between consecutive ones.
  const int order[8] = {0, 1, 6, 7, 4, 5, 2, 3};
  const Fp4Pivots& p = kFp4Pivots;
  const float pivots[7] = {p.lowest, p.low, p.mid_low, p.top, p.mid_high, p.high, p.highest};
  int ra = -1, rb = -1;
  for (int r = 0; r < 8; ++r) {
    if (order[r] == (a & 7)) ra = r;
    if (order[r] == (b & 7)) rb = r;
  }
  if (std::abs(ra - rb) != 1) return NAN;
  return (a & 8) ? -pivots[std::min(ra, rb)] : pivots[std::min(ra, rb)];
}

// True when x * (1/absmax) lies within a few ulps of `boundary`.
inline bool NearBoundary(float x, float absmax, float boundary) {
  if (std::isnan(boundary) || absmax == 0.0f) return false;
  const double scaled = double{x} * (1.0 / double{absmax});
  return std::fabs(scaled - boundary) <= 8 * std::fabs(double{boundary}) * 0x1p-24;
}

}  // namespace qlora::kernels
