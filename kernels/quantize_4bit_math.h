// Per-element arithmetic of bitsandbytes' 4-bit kernels, shared by the CPU and CUDA
// implementations so that both decide codes the same way: the NF4 and FP4 decision trees, the
// dynamic-map search of double quantization (dQuantize<0>), and the flush-to-zero that
// bitsandbytes gets from being built with --use_fast_math. Plain C++ (no torch), host and device.
#pragma once

#include <cstdint>

#include "kernels/codebooks_4bit.h"

#if defined(__CUDACC__)
#define QLORA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define QLORA_HOST_DEVICE inline
#endif

namespace qlora::kernels::math {

inline constexpr float kFloatMin = 1.17549435e-38f;  // smallest normal float

// What -ftz=true does to an operand or result: a subnormal becomes a zero of the same sign.
QLORA_HOST_DEVICE float FlushSubnormal(float v) {
  const float mag = v < 0.0f ? -v : v;
  return mag < kFloatMin ? v * 0.0f : v;  // v * 0 keeps the sign; NaN stays NaN
}

// a * b as bitsandbytes' fast-math build computes it (mul.ftz.f32): operands and result flushed.
QLORA_HOST_DEVICE float MulFtz(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return FlushSubnormal(FlushSubnormal(a) * FlushSubnormal(b));
#endif
}

// 1.0f / a. On the device this is bitsandbytes' fast-math rcp.approx.ftz.f32; on the host the
// exact quotient, which can differ from it in the last bit (the one known CPU/CUDA difference).
QLORA_HOST_DEVICE float Reciprocal(float a) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return 1.0f / FlushSubnormal(a);
#endif
}

// a + b rounded once (torch's separate add of the double-quant offset; never part of an FMA).
QLORA_HOST_DEVICE float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// The tables come in as arguments (kNf4Thresholds, kFp4Pivots, kDynamicMap on the host; copies
// passed as kernel parameters on the device, where namespace-scope arrays are not addressable).

// NF4 code of a scaled value: the number of thresholds it strictly exceeds. Equal to
// dQuantizeNF4's tree for every input (NaN exceeds none and gets code 0).
QLORA_HOST_DEVICE uint8_t Nf4Code(float x, const Nf4ThresholdTable& t) {
  uint8_t code = 0;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int i = 0; i < 15; ++i) code += x > t.v[i] ? 1 : 0;
  return code;
}

// dQuantizeFP4: sign bit from x < 0 (so -0.0 and NaN are positive), then a tree on |x|.
QLORA_HOST_DEVICE uint8_t Fp4Code(float x, const Fp4Pivots& p) {
  const uint8_t sign = x < 0.0f ? 0b1000 : 0;
  const float a = x < 0.0f ? -x : x;
  uint8_t code;
  if (a > p.top) {
    if (a > p.high) {
      code = a > p.highest ? 0b0011 : 0b0010;
    } else {
      code = a > p.mid_high ? 0b0101 : 0b0100;
    }
  } else if (a > p.low) {
    code = a > p.mid_low ? 0b0111 : 0b0110;
  } else {
    code = a > p.lowest ? 0b0001 : 0b0000;
  }
  return code + sign;
}

// dQuantize<0>: a 7-step binary search from pivot 127 over the sorted 256-entry code, then the
// nearer neighbour by comparing with the midpoints (upper+val)*0.5f and (lower+val)*0.5f.
QLORA_HOST_DEVICE uint8_t DynamicCode(const float* code, float x) {
  int pivot = 127;
  int upper_pivot = 255;
  int lower_pivot = 0;
  float lower = -1.0f;
  float upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower_pivot : pivot);
}

}  // namespace qlora::kernels::math
