// Differentiable fused elementwise ops of the decoder layer, over kernels/fused_elementwise.h:
// each is one autograd node whose forward and backward are one kernel each on CUDA (the ATen
// formula elsewhere), computing what autograd computes for the unfused formula.
//
//   Rotary(x, cos, sin) = x * cos + rotate_half(x) * sin      differentiable in x only
//   Swiglu(gate, up)    = silu(gate) * up                     saves gate and up, not silu(gate)
#pragma once

#include <ATen/core/Tensor.h>

namespace qlora::engine {

// x [batch, heads, seq, head_dim]; cos, sin [batch or 1, 1, seq, head_dim] (constants).
at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

at::Tensor Swiglu(const at::Tensor& gate, const at::Tensor& up);

}  // namespace qlora::engine
