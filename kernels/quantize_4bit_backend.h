// Internal: the two implementations behind quantize_4bit.h, with identical signatures. The
// entry points in quantize_4bit.cc validate arguments, allocate outputs and pick one by device;
// these functions assume contiguous, correctly sized tensors on their device.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/quantize_4bit.h"

namespace qlora::kernels {

// Where dequantization reads the per-block absmax from: a float32 tensor, or (double
// quantization) absmax = code[qabsmax[b]] * absmax2[b / nested_blocksize] + offset.
struct AbsmaxSource {
  const at::Tensor* absmax = nullptr;    // float32 [blocks], when not nested
  const at::Tensor* qabsmax = nullptr;   // uint8 [blocks]
  const at::Tensor* absmax2 = nullptr;   // float32 [nested blocks]
  const at::Tensor* code = nullptr;      // float32 [256]
  float offset = 0.0f;
  int64_t nested_blocksize = 256;
};

namespace cpu {
// x: float32/float16/bfloat16 [n] -> packed uint8 [(n+1)/2], absmax float32 [blocks].
void Quantize4bit(const at::Tensor& x, QuantType type, int64_t blocksize, at::Tensor& packed,
                  at::Tensor& absmax);
// x: float32 [n] -> codes uint8 [n], absmax float32 [blocks], by the dynamic map.
void QuantizeBlockwise8bit(const at::Tensor& x, int64_t blocksize, at::Tensor& codes,
                           at::Tensor& absmax);
// out float32 [n] = code[codes[i]] * absmax[i / blocksize] + offset.
void DequantizeBlockwise8bit(const at::Tensor& codes, const at::Tensor& absmax,
                             const at::Tensor& code, int64_t blocksize, float offset,
                             at::Tensor& out);
// out [n] (float32/float16/bfloat16) = lut[nibble] * absmax[block]; out may also be the weight's
// [rows, cols] with a row stride >= cols (values land in row-major order).
void Dequantize4bit(const at::Tensor& packed, const AbsmaxSource& absmax, QuantType type,
                    int64_t blocksize, at::Tensor& out);
}  // namespace cpu

// Compiled only when QLORA_HAVE_CUDA; same contracts, on the current CUDA stream.
namespace cuda {
// x: float32/float16/bfloat16 [n] -> packed uint8 [(n+1)/2], absmax float32 [blocks].
void Quantize4bit(const at::Tensor& x, QuantType type, int64_t blocksize, at::Tensor& packed,
                  at::Tensor& absmax);
// x: float32 [n] -> codes uint8 [n], absmax float32 [blocks], by the dynamic map.
void QuantizeBlockwise8bit(const at::Tensor& x, int64_t blocksize, at::Tensor& codes,
                           at::Tensor& absmax);
// out float32 [n] = code[codes[i]] * absmax[i / blocksize] + offset.
void DequantizeBlockwise8bit(const at::Tensor& codes, const at::Tensor& absmax,
                             const at::Tensor& code, int64_t blocksize, float offset,
                             at::Tensor& out);
// out [n] (float32/float16/bfloat16) = lut[nibble] * absmax[block]; out may also be the weight's
// [rows, cols] with a row stride >= cols (values land in row-major order), and then `after`'s
// columns follow each row (checked by the caller).
void Dequantize4bit(const at::Tensor& packed, const AbsmaxSource& absmax, QuantType type,
                    int64_t blocksize, at::Tensor& out, const ColumnsAfter* after = nullptr);
}  // namespace cuda

}  // namespace qlora::kernels
