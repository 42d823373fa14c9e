// Per-token log-probabilities of chosen targets, for the preference objectives (DPO, ORPO), which
// need each sequence's summed log-likelihood of its completion rather than one summed loss.
//
// Only the positions with a target are computed: their hidden states are gathered, and logits
// are computed for them in chunks (default 256 positions: hidden @ lm_head^T in the compute
// dtype, read as float32 as transformers reads them), reduced at once to log p(target) and the
// logits' mean over the vocabulary (TRL's logits/chosen metric); no [positions, vocab] tensor
// outlives its chunk. A chunk peaks at ~6 bytes a logit (the float32 logits are reduced in
// place), so 256 positions stay within what the memory plans give the causal-LM loss's 1024
// (activation_plan.h: a chunk of logits in the compute dtype). Backward recomputes each chunk's
// logits and takes
//   d logp / d logits = g (onehot(target) - softmax(logits))
// to grad_hidden through lm_head (frozen: no gradient of its own). A prompt the objective
// ignores costs no lm_head GEMM at all.
//
// Targets follow the HF convention: same shape as input_ids, NOT shifted (hidden[t - 1]
// predicts targets[t]), -100 = none. Targets on the host spare a device synchronization (the
// positions to score are found there; on the device finding them waits for the queue).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace qlora::engine {

struct TokenLogProbs {
  // [rows, seq] float32: log p(targets[r, t] | tokens before t); 0 where targets is -100 and at
  // t = 0. Differentiable w.r.t. hidden.
  at::Tensor logps;
  // [rows, seq] float32, no grad: the mean over the vocabulary of the logits that predict
  // targets[r, t]; 0 where there is none.
  at::Tensor mean_logits;
};

// hidden [rows, seq, hidden] (compute dtype), lm_head [vocab, hidden] (frozen), targets
// [rows, seq] int64 (-100 = none).
TokenLogProbs ComputeTokenLogProbs(const at::Tensor& hidden, const at::Tensor& lm_head,
                                   const at::Tensor& targets, int64_t chunk_size = 256);

}  // namespace qlora::engine
