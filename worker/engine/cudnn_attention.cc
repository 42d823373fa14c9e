// cuDNN causal attention and the dense dispatch (cudnn_attention.h).
#include "worker/engine/cudnn_attention.h"

#include <optional>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <c10/core/GradMode.h>

#ifdef QLORA_HAVE_CUDA
#include <ATen/native/transformers/cuda/sdp_utils.h>
#endif

namespace qlora::engine {

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
  // The log-sum-exp is what backward reads; without a graph to build it is not kept.
  const bool graph = c10::GradMode::is_enabled() &&
                     (q.requires_grad() || k.requires_grad() || v.requires_grad());
  return std::get<0>(at::_scaled_dot_product_cudnn_attention(
      q, k, v, /*attn_bias=*/std::nullopt, /*compute_log_sumexp=*/graph, /*dropout_p=*/0.0,
      /*is_causal=*/true, /*return_debug_mask=*/false));
}

at::Tensor DenseCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (CudnnAttentionApplies(q, k, v)) return CudnnCausalAttention(q, k, v);
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                          /*enable_gqa=*/k.size(1) != q.size(1));
}

}  // namespace qlora::engine
