// cuDNN causal attention and the dense dispatch (cudnn_attention.h).
#include "worker/engine/cudnn_attention.h"

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/engine/activation_offload.h"

#ifdef QLORA_HAVE_CUDA
#include <ATen/native/transformers/cuda/sdp_utils.h>
#endif

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One autograd node over ATen's cuDNN forward and backward ops (not the op's own formula: see
// the header), its backward passing the incoming gradient in the output's layout.
struct CudnnAttentionFunction : public torch::autograd::Function<CudnnAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) {
    auto [out, logsumexp, cum_q, cum_k, max_q, max_k, philox_seed, philox_offset, debug_mask] =
        at::_scaled_dot_product_cudnn_attention(q, k, v, /*attn_bias=*/std::nullopt,
                                                /*compute_log_sumexp=*/true, /*dropout_p=*/0.0,
                                                /*is_causal=*/true, /*return_debug_mask=*/false);
    SaveForBackward(ctx, {q, k, v, out, logsumexp});
    ctx->saved_data["philox_seed"] = philox_seed;
    ctx->saved_data["philox_offset"] = philox_offset;
    ctx->saved_data["max_q"] = max_q.expect_int();
    ctx->saved_data["max_k"] = max_k.expect_int();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = SavedForBackward(ctx);
    if (!grad_outputs[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor& out = saved[3];
    auto [grad_q, grad_k, grad_v] = at::_scaled_dot_product_cudnn_attention_backward(
        InLayoutOf(grad_outputs[0], out), saved[0], saved[1], saved[2], out, saved[4],
        ctx->saved_data["philox_seed"].toTensor(), ctx->saved_data["philox_offset"].toTensor(),
        /*attn_bias=*/at::Tensor(), /*cum_seq_q=*/at::Tensor(), /*cum_seq_k=*/at::Tensor(),
        ctx->saved_data["max_q"].toInt(), ctx->saved_data["max_k"].toInt(), /*dropout_p=*/0.0,
        /*is_causal=*/true);
    return {grad_q, grad_k, grad_v};
  }
};

// cuDNN's causal attention for inputs CudnnAttentionApplies accepts (not checked again here).
at::Tensor RunCudnnCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const bool graph = c10::GradMode::is_enabled() &&
                     (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (graph) return CudnnAttentionFunction::apply(q, k, v);
  // Without a graph to build, no log-sum-exp for backward either.
  return std::get<0>(at::_scaled_dot_product_cudnn_attention(
      q, k, v, /*attn_bias=*/std::nullopt, /*compute_log_sumexp=*/false, /*dropout_p=*/0.0,
      /*is_causal=*/true, /*return_debug_mask=*/false));
}

}  // namespace

at::Tensor InLayoutOf(const at::Tensor& t, const at::Tensor& like) {
  if (t.sizes() == like.sizes() && t.strides() == like.strides()) return t;
  at::Tensor copy = at::empty_strided(like.sizes(), like.strides(), t.options());
  copy.copy_(t);
  return copy;
}

bool CudnnAttentionApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#ifdef QLORA_HAVE_CUDA
  if (!q.is_cuda() || q.dim() != 4 || k.dim() != 4 || k.size(1) == 0 ||
      q.size(1) % k.size(1) != 0) {
    return false;
  }
  const sdp::sdp_params params{q, k, v, /*attn_mask=*/std::nullopt, /*dropout=*/0.0,
                               /*is_causal=*/true, /*enable_gqa=*/k.size(1) != q.size(1)};
  return sdp::can_use_cudnn_attention(params, /*debug=*/false);
#else
  (void)q, (void)k, (void)v;
  return false;
#endif
}

at::Tensor CudnnCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(CudnnAttentionApplies(q, k, v),
              "cuDNN attention cannot run these inputs (q ", q.sizes(), " ", q.scalar_type(),
              " on ", q.device(), ")");
  return RunCudnnCausalAttention(q, k, v);
}

at::Tensor DenseCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (CudnnAttentionApplies(q, k, v)) return RunCudnnCausalAttention(q, k, v);  // checked once
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
}

}  // namespace qlora::engine
