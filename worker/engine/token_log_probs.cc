// Chunked per-token log-probabilities with a recomputing backward (see token_log_probs.h).
#include "worker/engine/token_log_probs.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `t` on `like`'s device; from the host through pinned memory, so that the copy joins the
// stream's queue instead of waiting for it.
at::Tensor OnDeviceOf(const at::Tensor& t, const at::Tensor& like) {
  if (t.device() == like.device()) return t;
  if (like.is_cuda()) return t.pin_memory().to(like.device(), /*non_blocking=*/true);
  return t.to(like.device());
}

// The gathered positions' log p(target) [M] and mean logits [M], chunk by chunk.
std::pair<at::Tensor, at::Tensor> Forward(const at::Tensor& h, const at::Tensor& lm_head, const at::Tensor& t,
                                          int64_t chunk) {
  const int64_t m = h.size(0);
  at::Tensor logps = at::empty({m}, h.options().dtype(at::kFloat));
  at::Tensor means = at::empty({m}, h.options().dtype(at::kFloat));
  for (int64_t start = 0; start < m; start += chunk) {
    const int64_t end = std::min(m, start + chunk);
    const at::Tensor logits = at::matmul(h.slice(0, start, end), lm_head.t()).to(at::kFloat);
    const at::Tensor lse = at::logsumexp(logits, {-1});
    logps.slice(0, start, end).copy_(logits.gather(1, t.slice(0, start, end).unsqueeze(1)).squeeze(1) - lse);
    means.slice(0, start, end).copy_(logits.mean({-1}));
  }
  return {logps, means};
}

struct TokenLogProbsFunction : public torch::autograd::Function<TokenLogProbsFunction> {
  // h [M, hidden] (the gathered positions), t [M] targets -> {log p(t) [M], mean logits [M]}
  // (the second without a gradient).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& lm_head,
                               const at::Tensor& t, int64_t chunk) {
    ctx->save_for_backward({h, t});
    ctx->saved_data["lm_head"] = lm_head;
    ctx->saved_data["chunk"] = chunk;
    auto [logps, means] = Forward(h, lm_head, t, chunk);
    ctx->mark_non_differentiable({means});
    return {logps, means};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor& t = saved[1];
    const at::Tensor lm_head = ctx->saved_data["lm_head"].toTensor();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor g = grad_outputs[0].to(at::kFloat);
    at::Tensor grad_h = at::empty_like(h);
    for (int64_t start = 0; start < h.size(0); start += chunk) {
      const int64_t end = std::min(h.size(0), start + chunk);
      at::Tensor grad_logits = at::matmul(h.slice(0, start, end), lm_head.t()).to(at::kFloat).softmax(-1);
      grad_logits.neg_();
      const at::Tensor targets = t.slice(0, start, end).unsqueeze(1);
      grad_logits.scatter_add_(1, targets, at::ones_like(targets, grad_logits.options()));
      grad_logits.mul_(g.slice(0, start, end).unsqueeze(1));
      grad_h.slice(0, start, end).copy_(at::matmul(grad_logits.to(h.scalar_type()), lm_head));
    }
    return {grad_h, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

TokenLogProbs ComputeTokenLogProbs(const at::Tensor& hidden, const at::Tensor& lm_head,
                                   const at::Tensor& targets, int64_t chunk_size) {
  TORCH_CHECK(hidden.dim() == 3 && targets.dim() == 2 && hidden.size(0) == targets.size(0) &&
                  hidden.size(1) == targets.size(1),
              "ComputeTokenLogProbs: hidden [rows, seq, hidden] and targets [rows, seq] expected");
  TORCH_CHECK(chunk_size > 0, "ComputeTokenLogProbs: chunk_size must be positive");
  const int64_t rows = hidden.size(0), seq = hidden.size(1);
  const at::TensorOptions f32 = hidden.options().dtype(at::kFloat);
  TokenLogProbs out;
  if (seq < 2) {
    out.logps = at::zeros({rows, seq}, f32) + hidden.sum() * 0;  // keeps the graph
    out.mean_logits = at::zeros({rows, seq}, f32);
    return out;
  }
  // Position p of the flattened [rows, seq - 1] grid: hidden[r, t] predicting targets[r, t + 1].
  const at::Tensor shifted_here = targets.slice(1, 1).reshape({-1});
  const at::Tensor index_here = (shifted_here != -100).nonzero().squeeze(1);
  const at::Tensor shifted = OnDeviceOf(shifted_here, hidden);
  const at::Tensor index = OnDeviceOf(index_here, hidden);
  const at::Tensor h = hidden.slice(1, 0, seq - 1).reshape({-1, hidden.size(2)}).index_select(0, index);
  const at::Tensor t = shifted.index_select(0, index);
  const variable_list gathered_pair = TokenLogProbsFunction::apply(h, lm_head.detach(), t, chunk_size);
  const at::Tensor& gathered = gathered_pair[0];
  const at::Tensor means = gathered_pair[1].detach();
  const at::Tensor flat_zeros = at::zeros({rows * (seq - 1)}, f32);
  const at::Tensor logps = flat_zeros.index_put({index}, gathered).view({rows, seq - 1});
  out.logps = at::cat({at::zeros({rows, 1}, f32), logps}, 1);
  out.mean_logits = at::cat({at::zeros({rows, 1}, f32), flat_zeros.index_put({index}, means).view({rows, seq - 1})}, 1);
  return out;
}

}  // namespace qlora::engine
