// FP8 (e4m3) operands with one scale per row, and the GEMM over them: what the frozen base's
// forward GEMMs run on with quantization.float8_base_forward (worker/engine/float8_forward.h).
//
//   values = e4m3(clamp(x / scale, -448, 448))  (round to nearest even)
//   scale  = amax / 448, or 1 for a row of zeros
// where amax is the row's largest |x| for activations, and for a 4-bit weight's row the largest
// block absmax times the code table's largest magnitude: a bound read from the scales alone (it
// is the row's maximum wherever a block holds its own absmax, as quantizing always makes it), so
// the weight is written in one pass straight from its codes, never through a bf16 copy.
//
// The GEMM is x W^T = (sx * X8)(sw * W8)^T with float32 accumulation, rounded once to the output
// dtype: cuBLASLt's rowwise-scaled FP8 kernel through torch's _scaled_mm on CUDA (Hopper), the
// same products in float32 on the CPU (the tests' oracle).
// CPU: ATen ops; CUDA: one block per row. The two give the same values and scales bit for bit.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/quantize_4bit.h"

namespace qlora::kernels {

inline constexpr float kFloat8E4m3Max = 448.0f;

struct Float8Rows {
  at::Tensor values;  // float8_e4m3fn [rows, cols], contiguous
  at::Tensor scales;  // float32 [rows, 1], contiguous
};

// Rows x [rows, cols] (float32, float16 or bfloat16; unit column stride, any row stride) in FP8.
Float8Rows QuantizeRowsFloat8(const at::Tensor& x);

// Whether WeightRowsFloat8 takes q: 2-D, its rows whole blocks.
bool Float8WeightTakes(const Quantized4bit& q);

// The 4-bit weight q [out, in] in FP8, its codes and block scales on one device. With `into`
// (values [out, in] and scales [out, 1] of that device, both contiguous: rows of a larger
// buffer), written there and returned.
Float8Rows WeightRowsFloat8(const Quantized4bit& q, const Float8Rows* into = nullptr);

// x W^T [rows of x, rows of w] in out_dtype (bfloat16 on CUDA), from FP8 rows of x [T, in] and
// of w [out, in]; on CUDA in and out must be multiples of 16 (Float8GemmTakes). Into `into`
// where given ([T, out] of out_dtype with unit column stride, any row stride: rows of a wider
// buffer, which cuBLASLt writes in place) and returned.
at::Tensor Float8Matmul(const Float8Rows& x, const Float8Rows& w, at::ScalarType out_dtype,
                        const at::Tensor& into = at::Tensor());

bool Float8GemmTakes(int64_t in, int64_t out);

// Whether `device` runs these FP8 GEMMs: the CPU (emulated), or a Hopper GPU (compute capability
// 9.x) in a build with the CUDA kernels.
bool Float8GemmRunsOn(const at::Device& device);

}  // namespace qlora::kernels
