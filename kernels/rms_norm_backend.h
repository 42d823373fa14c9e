// Internal: the CUDA side of rms_norm.h (compiled only with QLORA_HAVE_CUDA). Each function
// returns false, touching nothing, when it does not take these tensors; the caller then runs the
// ATen formula.
#pragma once

#include <ATen/core/Tensor.h>

namespace qlora::kernels::cuda {

// Contiguous [rows, dim] tensors of one dtype (weight [dim]); rstd float32 [rows]; n may be
// rows of a wider buffer (any row stride). delta may be undefined (h is then x, and the h given
// is not written).
bool ResidualRmsNormForward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                            float eps, at::Tensor& h, at::Tensor& n, at::Tensor& rstd);
// grad_h may be undefined; grad_n, grad_h and dx may be rows of wider buffers.
bool RmsNormBackward(const at::Tensor& grad_n, const at::Tensor& h, const at::Tensor& rstd,
                     const at::Tensor& weight, const at::Tensor& grad_h, at::Tensor& dx);

}  // namespace qlora::kernels::cuda
