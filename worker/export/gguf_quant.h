// Number conversions for GGUF tensors, bit for bit as ggml's (and the gguf Python package's)
// reference code computes them: float32 to float16 and bfloat16 (round to nearest even), and
// Q8_0 (blocks of 32 values: a float16 scale max|x| / 127 and 32 int8 codes round(x / scale),
// halves rounded away from zero), all in float32 arithmetic.
#pragma once

#include <cstdint>
#include <vector>

namespace qlora::gguf {

uint16_t FloatToHalf(float f);
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);
float HalfToFloat(uint16_t h);

// `n` (a multiple of 32) values into n / 32 blocks of 34 bytes at `out`.
void QuantizeQ8_0(const float* x, int64_t n, uint8_t* out);

}  // namespace qlora::gguf
