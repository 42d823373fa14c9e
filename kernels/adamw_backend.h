// Internal: the CUDA side of adamw.h (compiled only with QLORA_HAVE_CUDA).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/adamw.h"

namespace qlora::kernels::cuda {

// Contiguous float32 tensors of one numel on one CUDA device; grad_factor undefined or a
// one-element float32/float64 tensor there. False, touching nothing, for anything else.
bool AdamWStep(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
               const at::Tensor& exp_avg_sq, const AdamWStepOptions& options,
               const at::Tensor& grad_factor);

}  // namespace qlora::kernels::cuda
