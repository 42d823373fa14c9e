// Causal-LM cross-entropy without materialising float32 logits for every position at once.
//
// Positions are processed in chunks (default 1024): each chunk's logits are computed once
// (hidden @ lm_head^T in the compute dtype, read as float32, as transformers does), reduced to a
// summed token loss by kernels/cross_entropy.h, which overwrites them with their gradient
// (softmax - onehot) * grad_scale, and taken to grad_hidden = that @ lm_head right away (when
// hidden requires grad), as Liger's fused linear cross-entropy does: one lm_head GEMM less per
// chunk than recomputing the logits in backward. Peak extra memory: one chunk x vocab in the
// compute dtype, plus grad_hidden (hidden's size) kept until backward.
//
// Labels follow the HF convention: same shape as input_ids, NOT shifted (position t's hidden
// state predicts labels[t + 1]), -100 = ignored. The result is the SUM of token losses and the
// number of target tokens, so callers normalise over a whole gradient-accumulation window.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace qlora::engine {

inline constexpr int64_t kIgnoreIndex = -100;

struct LossOptions {
  int64_t chunk_size = 1024;  // positions per chunk
  // The gradient backward is expected to bring to loss_sum (the trainer's loss scale): forward
  // folds it into the logits' gradient before rounding it; backward multiplies by the incoming
  // gradient over this (exactly 1 when it is right, so nothing is rounded twice). Not zero.
  double grad_scale = 1.0;
  // Count the target tokens into CausalLmLoss::num_tokens: a read back from the device, which
  // waits for every kernel queued so far. A caller that knows the count (the trainer counts its
  // batches' targets on the host) turns it off and leaves the GPU's queue full.
  bool count_tokens = true;
};

struct CausalLmLoss {
  at::Tensor loss_sum;  // float32 scalar, differentiable w.r.t. hidden
  int64_t num_tokens = 0;  // labels != -100 after the shift (0 without count_tokens)
};

// hidden [batch, seq, hidden] (compute dtype), lm_head [vocab, hidden] (frozen),
// labels [batch, seq] int64.
CausalLmLoss ComputeCausalLmLoss(const at::Tensor& hidden, const at::Tensor& lm_head,
                                 const at::Tensor& labels, const LossOptions& options = {});

}  // namespace qlora::engine
