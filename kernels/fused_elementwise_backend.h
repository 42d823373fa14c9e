// Internal: the CUDA side of fused_elementwise.h (compiled only with QLORA_HAVE_CUDA). Each
// function returns false, touching nothing, when it does not take these tensors (dtype, device,
// layout), and the caller falls back to the ATen formula.
#pragma once

#include <ATen/core/Tensor.h>

namespace qlora::kernels::cuda {

// out, x: [B, H, S, D] with unit last stride; cos, sin expanded to [B, H, S, D] (stride 0 where
// broadcast). backward: x is the output's gradient and out the input's.
bool Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward,
            at::Tensor& out);
// Contiguous gate and up of one shape and dtype; out contiguous or [rows, cols] rows of a wider
// buffer (unit column stride, cols and the row stride multiples of 16 bytes).
bool SwigluForward(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);
// grad_gate may be grad itself and grad_up up itself (written in place); `product` (a buffer of
// its own, or null) gets SwigluForward's output. grad may be rows of a wider buffer (as out
// above) when grad_gate is grad itself; the others are contiguous.
bool SwigluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                    at::Tensor& grad_gate, at::Tensor& grad_up, at::Tensor* product = nullptr);

}  // namespace qlora::kernels::cuda
