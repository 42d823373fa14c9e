// Causal attention through cuDNN's fused attention kernels, as one autograd node of our own.
//
// at::scaled_dot_product_attention already picks cuDNN on sm_90 for the model's shapes (faster
// than flash-attention 2 there), but its backward hands cuDNN the incoming gradient in whatever
// layout it arrives, and ATen caches one cuDNN plan per shape without that layout: once one
// layout has run for a shape, a gradient of another layout gets wrong q/k/v gradients (relative
// error above 1 for every shape tried, plain and grouped-query heads). This node hands cuDNN the
// gradient in the output's own layout, always, so every call for a shape agrees with its cached
// plan. Both findings: "Attention" in bench/reports/kernels_h200_2026-12-01_04.md.
//
// Used where ATen says cuDNN can run these inputs (sdp::can_use_cudnn_attention: a CUDA build,
// bf16/fp16, supported head sizes and hardware, SDPA's cuDNN backend enabled, deterministic
// algorithms off); everything else goes to at::scaled_dot_product_attention, so CPU results do
// not move.
#pragma once

#include <ATen/core/Tensor.h>

namespace qlora::engine {

// q [batch, heads, seq, head_dim]; k, v [batch, kv_heads, seq, head_dim] (kv_heads dividing
// heads): whether CudnnCausalAttention can run them.
bool CudnnAttentionApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Causal attention, scale 1 / sqrt(head_dim) -> [batch, heads, seq, head_dim] in q's dtype;
// differentiable in q, k and v (one node over ATen's cuDNN forward and backward). Throws c10::Error where
// CudnnAttentionApplies is false.
at::Tensor CudnnCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Unmasked causal attention as the model runs it: cuDNN where it applies, else
// at::scaled_dot_product_attention (grouped-query heads expanded by SDPA itself).
at::Tensor DenseCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// t (same sizes as `like`) with like's strides: t itself when they already agree, else a copy.
// cuDNN's backward is handed its incoming gradient in the output's layout this way.
at::Tensor InLayoutOf(const at::Tensor& t, const at::Tensor& like);

}  // namespace qlora::engine
