// LoraLinearFunction: a frozen linear layer with its LoRA adapter as one autograd node
// (LinearLayer::Forward; reached through linear4bit_internal.h's ApplyLoraLinear).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <vector>

#include "kernels/tuned_gemm.h"
#include "worker/engine/activation_offload.h"
#include "worker/engine/adapter_copies.h"
#include "worker/engine/linear4bit.h"
#include "worker/engine/linear4bit_internal.h"

namespace qlora::engine::linear4bit_internal {
namespace {

// y = x W^T + scale * (h A^T) B^T for rows of tokens x [T, in] (h = dropout(x), or x itself: the
// same tensor, which then gets no gradient of its own), as one autograd node, so that no pass over
// [T, out] or [T, in] is spent on adding partial results and no separate nodes or casts run:
//   forward:  y = scale * (h A^T) B^T        the rank-r GEMM writes y (beta = 0)
//             y += x W^T                     the base GEMM accumulates into it (beta = 1)
//   backward: dh' = (g B) * scale            [T, r]
//             dx = dh' A;  dx += g W         the rank-r GEMM writes dx, the base GEMM adds to it
//             dA = (h^T dh')^T, dB = ((h A^T)^T g * scale)^T   in float32, the adapters' dtype
// The large base term is rounded once, inside its GEMM's epilogue, where the separate ops (base
// output, then addmm into it) rounded it twice: in bf16 the node is at least as close to the
// float32 formula as they were (fused_paths_test checks both against it). With dropout, dh' A is
// h's gradient (autograd then takes it through the dropout to x). With value_unused (a
// checkpointed block's recomputation, see checkpoint.h) forward computes h A^T alone, which
// backward reads, and returns y unset.
struct LoraLinearFunction : public torch::autograd::Function<LoraLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& h,
                            const at::Tensor& a, const at::Tensor& b, const FrozenWeight* base,
                            double scale, bool value_unused, kernels::GemmTuner* gemm,
                            AdapterCopies* copies, bool owns_gradient_spare_columns) {
    const at::Tensor& lora_in = h;
    auto [y, ha] = LoraForward(x, lora_in, a, b, *base, scale, value_unused, gemm, copies);
    SaveBase(ctx, *base);
    SaveGemm(ctx, gemm);
    SaveCopies(ctx, copies);
    SaveForBackward(ctx, {lora_in, ha, a, b});
    ctx->saved_data["dropout"] = !h.is_same(x);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["owns_gradient_spare_columns"] = owns_gradient_spare_columns;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& g = grad_outputs[0];
    const variable_list saved = SavedForBackward(ctx);
    const at::Tensor &lora_in = saved[0], &ha = saved[1], &a = saved[2], &b = saved[3];
    const bool dropout = ctx->saved_data["dropout"].toBool();
    const double scale = ctx->saved_data["scale"].toDouble();
    if (!g.defined()) return variable_list(10);
    const at::ScalarType dtype = lora_in.scalar_type();
    const at::Tensor grad = g.scalar_type() == dtype ? g : g.to(dtype);
    kernels::GemmTuner* gemm = SavedGemm(ctx);
    // The input gradients only where something below takes them (x and h are one tensor
    // without dropout: then h's flag is x's).
    const bool x_grad = ctx->needs_input_grad(0), h_grad = dropout && ctx->needs_input_grad(1);
    // Without dropout, where the gradient's rows have spare columns: dh' there, dx one GEMM.
    const at::Tensor grad_with_dha =
        !dropout && x_grad ? OwnedColumnsAfter(ctx, grad, b.size(1)) : at::Tensor();
    AdapterCopies* copies = SavedCopies(ctx);
    LoraGradients d = LoraBackward(
        grad, lora_in, ha, a, b, scale, gemm, copies,
        /*input_gradient=*/dropout ? h_grad : x_grad && !grad_with_dha.defined(),
        grad_with_dha.defined() ? grad_with_dha.narrow(1, grad.size(1), b.size(1)) : at::Tensor());
    at::Tensor dx, dh;
    if (dropout) {
      if (x_grad) dx = Mm(gemm, grad, SavedBase(ctx, dtype));
      dh = d.lora_in;
    } else if (grad_with_dha.defined()) {
      dx = InputGradientOverRows(ctx, grad_with_dha, InDtype(copies, a, dtype), gemm);
    } else if (x_grad) {
      dx = d.lora_in;
      Addmm(gemm, dx, grad, SavedBase(ctx, dtype));
    }
    const std::vector<at::Tensor> ab = d.Cast(a);
    return {dx,           dh,           ab[0],        ab[1],        at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ApplyLoraLinear(const at::Tensor& x, const at::Tensor& h, const at::Tensor& a,
                           const at::Tensor& b, const FrozenWeight* base, double scale,
                           bool value_unused, kernels::GemmTuner* gemm, AdapterCopies* copies,
                           bool owns_gradient_spare_columns) {
  return LoraLinearFunction::apply(x, h, a, b, base, scale, value_unused, gemm, copies,
                                   owns_gradient_spare_columns);
}

}  // namespace qlora::engine::linear4bit_internal
