// GGUF number conversions (see gguf_quant.h).
#include "worker/export/gguf_quant.h"

#include <cmath>
#include <cstring>

namespace qlora::gguf {

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t exponent = (x >> 23) & 0xff;
  uint32_t mantissa = x & 0x7fffff;
  if (exponent == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
  const int32_t e = static_cast<int32_t>(exponent) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);  // overflow: infinity
  if (e <= 0) {                                                   // a subnormal half, or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 0x1f) {
    value = mantissa ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits |= sign;
  std::memcpy(&value, &bits, 4);
  return value;
}

uint16_t FloatToBf16(float f) {
  uint32_t n;
  std::memcpy(&n, &f, 4);
  if ((n & 0x7fffffff) > 0x7f800000) n = (n & 0xffff0000) | (64u << 16);  // a quiet NaN
  return static_cast<uint16_t>((static_cast<uint64_t>(n) + (0x7fff + ((n >> 16) & 1))) >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void QuantizeQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t block = 0; block < n / 32; ++block, x += 32, out += 34) {
    float most = 0;
    for (int i = 0; i < 32; ++i) most = std::fmax(most, std::fabs(x[i]));
    const float d = most / 127.0f;
    const float inverse = d == 0 ? 0.0f : 1.0f / d;
    const uint16_t scale = FloatToHalf(d);
    std::memcpy(out, &scale, 2);
    for (int i = 0; i < 32; ++i) {
      const float v = x[i] * inverse;
      const float a = std::fabs(v), floored = std::floor(a);
      const float rounded = floored + std::floor(2.0f * (a - floored));
      out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(v < 0 ? -rounded : rounded));
    }
  }
}

}  // namespace qlora::gguf
