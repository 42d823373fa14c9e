// SwigluLoraFunction: SwiGLU then the down projection with its adapter (and the residual add) as
// one autograd node, and the widened forward it shares with SwigluThenForward's no-grad path.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/fused_elementwise.h"
#include "kernels/tuned_gemm.h"
#include "worker/engine/activation_offload.h"
#include "worker/engine/adapter_copies.h"
#include "worker/engine/aligned_rows.h"
#include "worker/engine/float8_forward.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/linear4bit.h"
#include "worker/engine/linear4bit_internal.h"

namespace qlora::engine::linear4bit_internal {

std::pair<at::Tensor, at::Tensor> SwigluIntoWidenedRows(const at::Tensor& gate,
                                                        const at::Tensor& up, const at::Tensor& a,
                                                        kernels::GemmTuner* gemm,
                                                        AdapterCopies* copies) {
  const int64_t in = gate.size(1), r = a.size(0);
  const at::Tensor x = kernels::SwigluForwardWithSpareColumns(gate, up, AlignedRow(in + r) - in);
  const at::Tensor ha = WithSpareColumns(x, x.stride(0) - in).narrow(1, in, r);
  LoraAddmm(gemm, ha, x, InDtype(copies, a, x.scalar_type()).t(), /*beta=*/0.0);
  return {x, ha};
}

at::Tensor DownOverWidenedRows(const at::Tensor& x, const at::Tensor& b, const FrozenWeight& base,
                               double scale, kernels::GemmTuner* gemm, AdapterCopies* copies,
                               const at::Tensor& residual) {
  const int64_t in = x.size(1), r = b.size(1);
  const at::Tensor wide = WithSpareColumns(x, x.stride(0) - in).narrow(1, 0, in + r);
  if (RunsFloat8(base, x)) {  // the base in FP8, then x A^T (in the spare columns) times scale B
    at::Tensor y = Float8Forward(x, {&base}, HeldRows(base.dequantized, x.scalar_type()));
    LoraAddmm(gemm, y, wide.narrow(1, in, r), InDtype(copies, b, x.scalar_type()).t(),
              /*beta=*/1.0, /*alpha=*/scale);
    if (residual.defined()) y.add_(residual);
    return y;
  }
  at::Tensor y = at::empty({x.size(0), base.out_features}, x.options());
  Addmm(gemm, y, wide, WidenedWeight(base, in, b, scale, 0, x.scalar_type(), copies).t(),
        /*beta=*/residual.defined() ? 1.0 : 0.0, /*alpha=*/1.0, residual);
  return y;
}

namespace {

// The down projection with its adapter applied to silu(gate) * up, as one node (plus the
// residual stream, where given). The same values and gradients as Swiglu followed by
// LoraLinearFunction (without dropout; with a residual or widened rows, up to where the sums are
// rounded: fused_paths_test), in one of two modes:
//   plain (a layer whose saved tensors live from forward to backward): keeps gate and up (which
//     SwiGLU's backward needs anyway) but not their product x, the projection's input
//     ([T, intermediate], the largest tensor a layer would otherwise save): SwiGLU's backward,
//     which reads gate and up anyway, writes x again (the same bits) for the adapter's A
//     gradient, taken last (no pass of its own over gate and up to recompute it); with
//     lean_backward, x is recomputed first and freed before dx is allocated (one
//     [T, intermediate] less at this backward, one pass more);
//   value_unused (a checkpointed layer's recomputation, which lives one layer's backward): keeps
//     x as well, computes only h A^T (the output only carries the graph, checkpoint.h), and
//     backward writes dx over x once the adapter's gradients have read it.
// Either way SwiGLU's backward then writes grad_gate over dx, so that at the layer's backward,
// the step's memory peak, gate, up, dx and grad_up (and, plain, x) are the only
// [T, intermediate] tensors; with overwrite_inputs (gate and up are the caller's to give up: the
// decoder layer's own intermediates, which no one reads after this node) grad_up is written
// over up as well. With widened_rows, forward is SwigluIntoWidenedRows then DownOverWidenedRows
// (a recomputation's x and dx are then rows of the wider buffer; plain, ha is copied out of it
// so that x goes).
struct SwigluLoraFunction : public torch::autograd::Function<SwigluLoraFunction> {
  // residual: rows [T, out] of the residual stream, or an empty tensor for none (a node's inputs
  // are never undefined).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& residual_or_empty, const at::Tensor& a,
                            const at::Tensor& b, const FrozenWeight* base, double scale,
                            kernels::GemmTuner* gemm, AdapterCopies* copies,
                            const SwigluThenOptions* options) {
    const bool value_unused = options->value_unused;
    const at::Tensor residual = residual_or_empty.numel() > 0 ? residual_or_empty : at::Tensor();
    at::Tensor x, y, ha;
    if (options->widened_rows) {
      std::tie(x, ha) = SwigluIntoWidenedRows(gate, up, a, gemm, copies);
      if (value_unused) {
        y = ValueUnused({x.size(0), base->out_features}, x.options());
      } else {
        y = DownOverWidenedRows(x, b, *base, scale, gemm, copies, residual);
        ha = ha.contiguous();  // [T, r] of its own: x's rows go when forward ends
      }
    } else {
      x = kernels::SwigluForward(gate, up);
      std::tie(y, ha) = LoraForward(x, x, a, b, *base, scale, value_unused, gemm, copies, residual);
    }
    SaveBase(ctx, *base);
    SaveGemm(ctx, gemm);
    SaveCopies(ctx, copies);
    // x, never seen outside this node, is saved only by a recomputation.
    SaveForBackward(ctx, {gate, up, ha, a, b, value_unused ? x : at::Tensor()});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["overwrite_inputs"] = options->overwrite_inputs;
    ctx->saved_data["lean_backward"] = options->lean_backward;
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["owns_gradient_spare_columns"] = options->owns_output_gradient_spare_columns;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& g = grad_outputs[0];
    const variable_list saved = SavedForBackward(ctx);
    if (!g.defined()) return variable_list(10);
    const at::Tensor &gate = saved[0], &up = saved[1], &ha = saved[2], &a = saved[3], &b = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::ScalarType dtype = gate.scalar_type();
    const at::Tensor grad = g.scalar_type() == dtype ? g : g.to(dtype);
    kernels::GemmTuner* gemm = SavedGemm(ctx);
    AdapterCopies* copies = SavedCopies(ctx);
    LoraGradients d;
    at::Tensor dx;
    const bool recomputation = saved[5].defined();
    const bool lean = ctx->saved_data["lean_backward"].toBool();
    // Where the gradient's rows have spare columns: dh' there, and dx = [g | dh'] [W; A] as one
    // GEMM (InputGradientOverRows) instead of dh' A written for the base GEMM to add to.
    const at::Tensor grad_with_dha = OwnedColumnsAfter(ctx, grad, b.size(1));
    const at::Tensor dha_into = grad_with_dha.defined()
                                    ? grad_with_dha.narrow(1, grad.size(1), b.size(1))
                                    : at::Tensor();
    if (recomputation) {
      dx = saved[5];  // x: read by the adapter's gradients, then overwritten by dx
      d = LoraBackward(grad, dx, ha, a, b, scale, gemm, copies, /*input_gradient=*/false,
                       dha_into);
      if (!dha_into.defined()) LoraAddmm(gemm, dx, d.dha, InDtype(copies, a, dtype), /*beta=*/0.0);
    } else if (lean) {
      {
        const at::Tensor x = kernels::SwigluForward(gate, up);  // freed before dx is allocated
        d = LoraBackward(grad, x, ha, a, b, scale, gemm, copies, /*input_gradient=*/false,
                         dha_into);
      }
      if (!dha_into.defined()) dx = LoraInputGradient(d, a, dtype, gemm, copies);
    } else {
      // dA waits for x, which SwiGLU's backward below writes from the gate and up it reads.
      d = LoraBackward(grad, at::Tensor(), ha, a, b, scale, gemm, copies, /*input_gradient=*/false,
                       dha_into);
      if (!dha_into.defined()) dx = LoraInputGradient(d, a, dtype, gemm, copies);
    }
    if (dha_into.defined()) {
      dx = InputGradientOverRows(ctx, grad_with_dha, InDtype(copies, a, dtype), gemm, dx);
    } else {
      Addmm(gemm, dx, grad, SavedBase(ctx, dtype));  // dx = dh' A + g W
    }
    const bool product_wanted = !recomputation && !lean;
    at::Tensor grad_gate = dx, grad_up, x;
    at::Tensor* product = product_wanted ? &x : nullptr;
    const bool overwrite = ctx->saved_data["overwrite_inputs"].toBool();
    if (overwrite && PackedColumns({gate, up}).defined()) {
      // gate and up side by side (packed gate/up): their gradients go over them, packed as
      // well, for the gate/up node's one GEMM; dx goes when this returns.
      grad_gate = gate;
      grad_up = up;
      kernels::SwigluBackwardIntoInputs(dx, grad_gate, grad_up, product);
    } else if (overwrite && up.is_contiguous()) {
      grad_up = up;
      kernels::SwigluBackwardOverInputs(dx, gate, grad_up, product);
    } else {
      grad_up = kernels::SwigluBackwardInPlace(dx, gate, up, product);
    }
    if (product_wanted) LoraAGradient(d, x, gemm);
    const std::vector<at::Tensor> ab = d.Cast(a);
    // The residual stream's own gradient is the output's (y = residual + ...).
    const at::Tensor grad_residual = ctx->saved_data["residual"].toBool() ? g : at::Tensor();
    return {grad_gate,    grad_up,      grad_residual, ab[0],        ab[1],       at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(),  at::Tensor()};
  }
};

}  // namespace

at::Tensor ApplySwigluLora(const at::Tensor& gate, const at::Tensor& up,
                           const at::Tensor& residual_or_empty, const at::Tensor& a,
                           const at::Tensor& b, const FrozenWeight* base, double scale,
                           kernels::GemmTuner* gemm, AdapterCopies* copies,
                           const SwigluThenOptions* options) {
  return SwigluLoraFunction::apply(gate, up, residual_or_empty, a, b, base, scale, gemm, copies,
                                   options);
}

}  // namespace qlora::engine::linear4bit_internal
