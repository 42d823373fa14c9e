// Fused elementwise passes of the LLaMA decoder layer, forward and backward: rotary position
// embedding and SwiGLU. Each computes exactly what its unfused ATen formula computes, rounding
// where that formula rounds (every op's result to the tensor dtype), in one pass over memory:
//
//   rotary:  out = x * cos + rotate_half(x) * sin      rotate_half(x) = cat(-x2, x1)
//            grad_x = g * cos + cat((g * sin)2, -(g * sin)1)          (x1, x2: halves of dim -1)
//   SwiGLU:  out = silu(gate) * up
//            grad_up = g * silu(gate),  grad_gate = silu_backward(g * up, gate)
//
// CPU (and any tensor the CUDA kernels do not take): the formulas themselves as ATen ops, the
// oracle of tests/kernels/fused_elementwise_test.cc. CUDA (built with nvcc): one kernel per
// call, 16-byte accesses; the rotary kernels equal the formula bit for bit, SwiGLU within the
// contraction of silu_backward's arithmetic (one bf16 ulp). Inputs: float32, float16, bfloat16.
#pragma once

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

// x [batch, heads, seq, dim] (any strides; the head dim is the last), cos and sin broadcastable
// to it over heads (HF: [batch, 1, seq, dim]) in x's dtype; dim even. Output: x's layout.
at::Tensor RotaryForward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// The gradient of RotaryForward with respect to x, for the gradient of its output.
at::Tensor RotaryBackward(const at::Tensor& grad_out, const at::Tensor& cos,
                          const at::Tensor& sin);
// RotaryBackward's values written into `out` (grad_out's shape; any strides: a view into a wider
// buffer, e.g. a column block of packed gradient rows, stays one).
void RotaryBackwardInto(const at::Tensor& grad_out, const at::Tensor& cos, const at::Tensor& sin,
                        at::Tensor& out);
// RotaryForward's values written over x itself (a view into a wider buffer stays one: nothing
// beside it is touched).
void RotaryForwardInPlace(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The q/k/v gradients into packed gradient rows: `rotated` ([batch, heads_i, seq, dim] each: q's
// and k's) through RotaryBackward and `copied` (v's, or undefined) as it is, into out
// [batch, sum of heads, seq, dim] (a view of the rows) side by side in that order; cos and sin
// broadcastable to out. One launch on CUDA for up to three parts where the layouts allow (16-byte
// vectors), else RotaryBackwardInto and a copy each. The same values either way.
void RotaryBackwardAndCopyInto(at::TensorList rotated, const at::Tensor& copied,
                               const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out);

// out (float32, contiguous) = in (contiguous, out's numel, a 16-bit float dtype) as float32, its
// first `rows` x scale.numel() values (a [rows, cols] block) each times scale[column] (scale
// [cols], in's dtype): the product of exact float32 values rounded once, what
// out.copy_(in) then out[:rows * cols].view({rows, cols}).mul_(scale) computes, in one pass (one
// launch on CUDA). A grouped node's adapter gradients cast to float32 with the norm weight's
// factor on its As' gradient (worker/engine GroupBackward).
void CastScalingLeadingRows(const at::Tensor& in, const at::Tensor& out, int64_t rows,
                            const at::Tensor& scale);

// x (contiguous float32, float16 or bfloat16) = x times `factor` (a float32 scalar on x's
// device), each product rounded to float32 and then to x's dtype: what
// x.copy_(x.to(float32).mul_(factor)) computes, in place, without the float32 copy (one launch on
// CUDA, which reads the factor on the device and leaves x untouched where it is exactly 1). The
// causal-LM loss's hidden gradient times the incoming gradient over the one its forward assumed
// (worker/engine/causal_lm_loss.h).
void ScaleInPlace(const at::Tensor& x, const at::Tensor& factor);

// gate, up: the same shape and dtype (either may be rows of a wider buffer) -> silu(gate) * up.
at::Tensor SwigluForward(const at::Tensor& gate, const at::Tensor& up);
// The same for gate, up [rows, cols], written into rows of cols + spare values: a [rows, cols]
// view whose rows are each followed by `spare` unset values (for a GEMM over widened rows).
at::Tensor SwigluForwardWithSpareColumns(const at::Tensor& gate, const at::Tensor& up,
                                         int64_t spare);
// {grad_gate, grad_up} for the gradient of SwigluForward's output.
std::pair<at::Tensor, at::Tensor> SwigluBackward(const at::Tensor& grad_out,
                                                 const at::Tensor& gate, const at::Tensor& up);
// The same, with grad_gate written over grad_out (contiguous or, 2-D, rows of a wider buffer; not
// read by anyone afterwards): returns grad_up. One buffer of gate's size less at the MLP's
// backward, the step's memory peak.
// With `product`: sets it to SwigluForward(gate, up), the same bits, from the values the pass
// reads anyway (for a backward that needs the forward's output again: no second pass over gate
// and up).
at::Tensor SwigluBackwardInPlace(at::Tensor& grad_out, const at::Tensor& gate,
                                 const at::Tensor& up, at::Tensor* product = nullptr);
// The same with grad_up written over up too (contiguous or rows, read by no one afterwards): no
// new buffer at all (but `product`'s).
void SwigluBackwardOverInputs(at::Tensor& grad_out, const at::Tensor& gate, at::Tensor& up,
                              at::Tensor* product = nullptr);
// The gradients written over gate and up themselves (each contiguous or rows of a wider buffer:
// side by side in one packed buffer, they come out as the packed gradient that one GEMM over the
// stacked gate/up weight takes); grad_out is only read.
void SwigluBackwardIntoInputs(const at::Tensor& grad_out, at::Tensor& gate, at::Tensor& up,
                              at::Tensor* product = nullptr);

}  // namespace qlora::kernels
