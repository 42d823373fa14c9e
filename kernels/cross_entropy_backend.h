// Internal: the CUDA side of cross_entropy.h (compiled only with QLORA_HAVE_CUDA). Returns false,
// touching nothing, when it does not take these tensors; the caller then runs the ATen formula.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace qlora::kernels::cuda {

// logits [n, vocab] contiguous, targets [n] int64 contiguous, losses [n] float32.
bool CrossEntropyWithGradient(at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                              bool write_gradient, float grad_scale, at::Tensor& losses);

}  // namespace qlora::kernels::cuda
