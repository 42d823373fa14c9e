// Internal: the CUDA side of lora_gradients.h (compiled only with QLORA_HAVE_CUDA), for tensors
// LoraGradientPairFused accepts.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/lora_gradients.h"

namespace qlora::kernels::cuda {

// One adapter's tensors: g [T, out], b [out, r] (contiguous), ha [T, r]; dha, db written.
struct PairOperands {
  at::Tensor g, b, ha;
  float scale;
  at::Tensor dha, db;
  at::Tensor row_scale, dha_scaled;  // optional (LoraGradientPairOperands)
};

// 1 to kMaxLoraGradientPairs adapters of one rank and one T, in one launch of each kernel.
void LoraGradientPairs(const std::vector<PairOperands>& pairs, int blocks_per_sm, int tile_rows);

}  // namespace qlora::kernels::cuda
