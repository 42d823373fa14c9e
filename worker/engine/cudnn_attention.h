// Causal attention through cuDNN's fused attention kernels (ATen's cuDNN SDPA backend), called
// directly: at::scaled_dot_product_attention's priority order takes flash-attention 2 first,
// which on an H200 at the training shapes runs at ~270-300 TFLOP/s forward and ~230 backward
// where cuDNN's run at ~475-515 and ~400 (bench/attention_backends.py; results in
// bench/results/2026-12-01-h200-attention-backends.txt).
//
// Used where ATen says cuDNN can run these inputs (sdp::can_use_cudnn_attention: a CUDA build,
// bf16/fp16, supported head sizes and hardware, SDPA's cuDNN backend enabled, deterministic
// algorithms off); everything else keeps its old path, so CPU results do not move.
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
