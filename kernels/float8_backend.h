// Internal: the CUDA side of float8.h (float8_cuda.cu), compiled only when QLORA_HAVE_CUDA. The
// entry points in float8.cc check the arguments and allocate the outputs.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/codebooks_4bit.h"

namespace qlora::kernels::cuda {

// x [rows, cols] (unit column stride) -> values [rows, cols] e4m3, scales [rows, 1] float32.
void QuantizeRowsFloat8(const at::Tensor& x, const at::Tensor& values, const at::Tensor& scales);

// The packed codes of a [rows, cols] weight with float32 `block_absmax` (cols a multiple of the
// blocksize, itself of 8) -> values, scales; `table` the code values, `table_max` their largest
// magnitude.
void WeightRowsFloat8(const at::Tensor& packed, const at::Tensor& block_absmax,
                      const Codebook16& table, float table_max, int64_t blocksize,
                      const at::Tensor& values, const at::Tensor& scales);

// Whether CUDA device `index` runs the rowwise-scaled FP8 GEMM: Hopper (compute capability 9.x),
// where cuBLASLt (12.9 and newer) scales by a vector per row; Ada's and Blackwell's FP8 GEMMs take
// other scalings there.
bool DeviceHasFloat8(int index);

}  // namespace qlora::kernels::cuda
