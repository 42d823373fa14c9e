// Blockwise 4-bit (NF4 / FP4) quantization in the bitsandbytes layout, with optional double
// quantization of the absmax values. One entry point per direction; it dispatches to the CPU
// implementation (multi-threaded, also the test oracle) or the CUDA one by the input's device.
//
// Layout (byte-for-byte bitsandbytes, see shared/reference/formats.md section 1):
//   packed[j] = code(x[2j]) << 4 | code(x[2j+1])      (even element in the high nibble)
//   absmax[b] = max |x| over block b (fp32), or, when double-quantized,
//   absmax[b] = nested_code[qabsmax[b]] * nested_absmax[b / 256] + nested_offset.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

enum class QuantType { kNF4, kFP4 };

struct Quantize4bitOptions {
  QuantType type = QuantType::kNF4;
  int64_t blocksize = 64;        // power of two in [32, 4096]
  bool double_quant = true;      // compress_statistics
  int64_t nested_blocksize = 256;
};

// Everything needed to dequantize, and to write/read the six bitsandbytes safetensors keys.
struct Quantized4bit {
  at::Tensor packed;             // uint8 [(n + 1) / 2], on the input's device
  // Without double quantization: float32 [blocks]. With it: uint8 [blocks] (codes into
  // nested_code), and nested_absmax / nested_code / nested_offset are set.
  at::Tensor absmax;
  at::Tensor nested_absmax;      // float32 [ceil(blocks / nested_blocksize)]
  at::Tensor nested_code;        // float32 [256], the bitsandbytes dynamic map
  float nested_offset = 0.0f;
  bool double_quant = false;
  QuantType type = QuantType::kNF4;
  int64_t blocksize = 64;
  int64_t nested_blocksize = 256;
  std::vector<int64_t> shape;    // original shape, row-major
  at::ScalarType dtype = at::kBFloat16;  // original / dequantized dtype
};

// Quantizes a float32, float16 or bfloat16 tensor (CPU or CUDA). Throws c10::Error on bad input.
Quantized4bit Quantize4bit(const at::Tensor& input, const Quantize4bitOptions& options);

// Dequantizes to `q.dtype` (or `dtype` when given) with q.shape, on q.packed's device.
at::Tensor Dequantize4bit(const Quantized4bit& q);
at::Tensor Dequantize4bit(const Quantized4bit& q, at::ScalarType dtype);

// The float32 per-block absmax (resolving double quantization), on q's device.
at::Tensor BlockAbsmax(const Quantized4bit& q);

}  // namespace qlora::kernels
