// Internal: the CUDA side of lora_gradients.h (compiled only with QLORA_HAVE_CUDA), for tensors
// LoraGradientPairFused accepts.
#pragma once

#include <ATen/core/Tensor.h>

namespace qlora::kernels::cuda {

void LoraGradientPair(const at::Tensor& g, const at::Tensor& b, const at::Tensor& ha, float scale,
                      const at::Tensor& dha, const at::Tensor& db, int blocks_per_sm,
                      int tile_rows);

}  // namespace qlora::kernels::cuda
