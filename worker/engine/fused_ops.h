// Differentiable fused elementwise ops of the decoder layer, over kernels/fused_elementwise.h:
// each is one autograd node whose forward and backward are one kernel each on CUDA (the ATen
// formula elsewhere), computing what autograd computes for the unfused formula.
//
//   Rotary(x, cos, sin) = x * cos + rotate_half(x) * sin      differentiable in x only
//   Swiglu(gate, up)    = silu(gate) * up                     saves gate and up, not silu(gate)
//   SumGraphOnly(a, b)  = a + b's autograd node, value unset   for a checkpointed recomputation
//   CatGraphOnly(parts, dim) = at::cat's node, value unset     the same, for tiles' outputs
//   ResidualRmsNorm(x, delta, w) = {h = x + delta, rms_norm(h) * w}   differentiable in x and
//                         delta (one gradient for both: the norm's plus h's own, summed in the
//                         kernel); saves h and rstd. Without delta, h is x passed through: the
//                         norm of a residual stream whose other use adds its gradient in the
//                         norm's backward kernel instead of a separate pass. It also
//                         gives rstd = 1 / rms(h) (not differentiable), with which a consumer
//                         may keep h (which the norm keeps anyway) instead of the output
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace qlora::engine {

// x [batch, heads, seq, head_dim]; cos, sin [batch or 1, 1, seq, head_dim] (constants).
at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

at::Tensor Swiglu(const at::Tensor& gate, const at::Tensor& up);

// An output of a's shape whose gradient goes to a and b as a + b's would, with an unspecified
// value and no pass over memory: the end of a checkpointed block's recomputation, whose output
// only carries the graph (checkpoint.h).
at::Tensor SumGraphOnly(const at::Tensor& a, const at::Tensor& b);

// An output of the parts joined along dim whose gradient is split among them as at::cat's would,
// with an unspecified value and no memory: the tiles of a recomputation (no [rows, hidden] buffer
// for a value nobody reads).
at::Tensor CatGraphOnly(const std::vector<at::Tensor>& parts, int64_t dim);

// A tensor of `sizes` whose value is never read (a recomputation's outputs that only carry the
// graph): one element expanded, so that it holds no memory.
at::Tensor ValueUnused(at::IntArrayRef sizes, const at::TensorOptions& options);

// The residual add and the RMSNorm of its result as one node: {h, normalized h n = h * rstd *
// weight, the float32 rstd of h's rows (x's shape without the last dim; not differentiable)};
// weight in x's dtype and frozen; delta may be undefined (h = x). With spare_columns, n's rows
// are followed by that many unset values (kernels/rms_norm.h) for SharedInputForward's widened
// GEMMs (linear4bit.h); with grad_spare_columns, so are the rows of the gradient backward
// returns (for x and delta), for the input-gradient GEMMs of the LoRA nodes that take it
// (linear4bit.h OutputGradientSpareColumns).
struct NormedResidual {
  at::Tensor h, n, rstd;
};
NormedResidual ResidualRmsNorm(const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, int64_t spare_columns = 0,
                               int64_t grad_spare_columns = 0);

}  // namespace qlora::engine
