// The decoder's residual add fused with the RMSNorm that reads its result, forward and backward:
//
//   forward:   h = x + delta                               (rounded to the dtype, as ATen's add;
//                                                          h = x without a delta)
//              n = h * rstd * weight,  rstd = 1 / sqrt(mean(h^2) + eps)   (float32 inside, one
//                                                          rounding: ATen's rms_norm formula)
//   backward:  dx = rstd * (w * dn) - h * rstd^3 * mean(w * dn * h) + dh   (float32, one rounding)
//
// dh is the gradient that reaches h along the residual stream; the result is the gradient of
// both x and delta. CPU (and any tensor the CUDA kernels do not take): ATen ops, the oracle of
// tests/kernels/rms_norm_test.cc. CUDA: one block per row, 16-byte accesses, one kernel each way
// (the add and the norm's extra read of h, and backward's separate add of dh, are gone).
#pragma once

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

struct ResidualRmsNormResult {
  at::Tensor h, n;  // x's shape and dtype
  at::Tensor rstd;  // float32, one per row (x's shape without the last dim)
};

// x, delta: one shape and dtype, last dim = weight's size; weight: x's dtype. delta may be
// undefined: h is then x itself (the RMSNorm alone, with the rstd that backward wants). With
// spare_columns > 0, n's rows are the first dim values of rows dim + spare_columns long (n's
// stride says so; the spare values are left unset) for a consumer that puts its own columns
// beside n's (the LoRA-widened GEMMs of worker/engine/linear4bit.h).
ResidualRmsNormResult ResidualRmsNormForward(const at::Tensor& x, const at::Tensor& delta,
                                             const at::Tensor& weight, double eps,
                                             int64_t spare_columns = 0);

// grad_n, h: h's shape and dtype (grad_n and grad_h may have any strides: rows of a wider buffer
// are read in place on CUDA); rstd from forward; grad_h: h's shape and dtype, or undefined (no
// residual gradient). Returns dx in h's shape and dtype; with dx_spare_columns > 0, its rows are
// the first dim values of rows dim + dx_spare_columns long (the spare values unset), for a
// consumer that puts its own columns beside the gradient's (the LoRA nodes' input gradients
// with the adapters' low-rank term inside).
at::Tensor RmsNormBackward(const at::Tensor& grad_n, const at::Tensor& h, const at::Tensor& rstd,
                           const at::Tensor& weight, const at::Tensor& grad_h,
                           int64_t dx_spare_columns = 0);

}  // namespace qlora::kernels
