// Blockwise 4-bit (NF4 / FP4) quantization in the bitsandbytes layout, with optional double
// quantization of the absmax values. One entry point per direction; it dispatches to the CPU
// implementation (multi-threaded, also the test oracle) or the CUDA one by the input's device.
//
// Layout (byte-for-byte bitsandbytes: functional.quantize_4bit / kQuantizeBlockwise):
//   packed[j] = code(x[2j]) << 4 | code(x[2j+1])      (even element in the high nibble)
//   absmax[b] = max |x| over block b (fp32), or, when double-quantized,
//   absmax[b] = nested_code[qabsmax[b]] * nested_absmax[b / 256] + nested_offset.
//
// Numerics (what "equal to bitsandbytes" means): bitsandbytes' CUDA library is built with
// --use_fast_math, so it scales by rcp.approx.ftz(absmax) and multiplies with subnormals flushed
// to zero. Our CUDA kernels issue those same instructions and match it bit for bit. The CPU
// implementation flushes subnormals the same way but uses the exact reciprocal 1.0f / absmax, so
// its quantize may pick the neighbouring code where x * (1/absmax) lands within an ulp of a
// decision threshold (rare; the fixture test counts them). Dequantization is exact on both: one
// float32 multiply lut * absmax then a round-to-nearest-even cast; double-quantized absmax is
// code * absmax2 then + offset, never fused. An all-zero block has absmax 0, scales to NaN and
// gets code 0 (NF4 -> -0.0), as on CUDA bitsandbytes.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/block_writes.h"

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
// Columns Dequantize4bitInto may write after each row of the weight, in the same launch: `zeros`
// zero columns, then scale * values [rows, r] (float32, unit column stride), each product
// rounded once to out's dtype (as at::mul_out into such a view would), then `trailing_zeros`
// zero columns. The widened weight's adapter columns [W | 0 | scale B | 0] of worker/engine's
// LoRA-widened GEMMs.
struct ColumnsAfter {
  int64_t zeros = 0;
  at::Tensor values;
  double scale = 1.0;
  int64_t trailing_zeros = 0;
};

// The same written into `out`: q.shape as [rows, cols] (rows = shape[0]) in a float dtype on
// q's device, unit column stride, any row stride >= cols (a weight placed in wider rows, as
// the LoRA-widened GEMMs of worker/engine read it); with `after`, also those columns, which
// the row stride must leave room for.
void Dequantize4bitInto(const Quantized4bit& q, const at::Tensor& out,
                        const ColumnsAfter* after = nullptr);
// Just `after`'s columns after the rows of out [rows, cols] (what Dequantize4bitInto writes there
// too), for a weight written there otherwise (a dense one copied in, or one kept dequantized):
// one launch on CUDA (block_writes.h), ATen ops elsewhere.
void WriteColumnsAfter(const at::Tensor& out, const ColumnsAfter& after);
// The blocks WriteColumnsAfter(out, after) writes (out float32, float16 or bfloat16): zeros,
// scale * values, zeros after out's rows, for a caller that writes them with others in one
// WriteBlocks (the same bits).
std::vector<BlockWrite> ColumnsAfterBlocks(const at::Tensor& out, const ColumnsAfter& after);

// The float32 per-block absmax (resolving double quantization), on q's device.
at::Tensor BlockAbsmax(const Quantized4bit& q);

// The 16-entry quant_map bitsandbytes serializes for `type` (float32, CPU). Same values as the
// dequantization LUT, except FP4 code 8 which is +0.0 here (the CUDA kernels produce -0.0).
at::Tensor SerializedQuantMap(QuantType type);

// bitsandbytes' 256-entry dynamic map (float32, CPU): the nested_quant_map of double quantization.
at::Tensor DynamicMap();

// The 8-bit blockwise step of double quantization, bitsandbytes' quantize_blockwise(x, code=
// DynamicMap(), blocksize): float32 `x` (contiguous, CPU or CUDA) -> uint8 codes [numel] and
// float32 absmax [ceil(numel / blocksize)]. Quantize4bit calls it on absmax - mean(absmax).
struct Blockwise8bit {
  at::Tensor codes;
  at::Tensor absmax;
};
Blockwise8bit QuantizeBlockwise8bit(const at::Tensor& x, int64_t blocksize);

// Its inverse plus the offset, as bitsandbytes computes it: code[q] * absmax[i / blocksize] in
// float32, then + offset as a separate rounding step (never a fused multiply-add).
at::Tensor DequantizeBlockwise8bit(const at::Tensor& codes, const at::Tensor& absmax,
                                   const at::Tensor& code, int64_t blocksize, float offset);

// Whether this build holds the CUDA kernels (a CUDA input without them throws).
bool HasCudaKernels();

}  // namespace qlora::kernels
