// Causal-LM cross-entropy without materialising float32 logits for every position at once.
//
// Positions are processed in chunks (default 1024): each chunk's logits are computed
// (hidden @ lm_head^T in the compute dtype, then float32, as transformers does), reduced to a
// summed token loss and dropped; backward recomputes each chunk's logits to form
// grad_hidden = (softmax - onehot) @ lm_head. Peak extra memory is one chunk x vocab in float32.
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
};

struct CausalLmLoss {
  at::Tensor loss_sum;  // float32 scalar, differentiable w.r.t. hidden
  int64_t num_tokens = 0;  // labels != -100 after the shift
};

// hidden [batch, seq, hidden] (compute dtype), lm_head [vocab, hidden] (frozen),
// labels [batch, seq] int64.
CausalLmLoss ComputeCausalLmLoss(const at::Tensor& hidden, const at::Tensor& lm_head,
                                 const at::Tensor& labels, const LossOptions& options = {});

}  // namespace qlora::engine
