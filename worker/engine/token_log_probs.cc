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

// The float32 logits of chunk [start, end) of the gathered positions: hidden @ lm_head^T in the
// compute dtype, read as float32 (the compute-dtype product freed at once).
at::Tensor ChunkLogits(const at::Tensor& h, const at::Tensor& lm_head, int64_t start, int64_t end) {
  return at::matmul(h.slice(0, start, end), lm_head.t()).to(at::kFloat);
}

// The gathered positions' log p(target) [M] and mean logits [M], chunk by chunk. The reductions
// overwrite each chunk's logits in place, so a chunk peaks at ~6 bytes per logit (the product in
// the compute dtype, then its float32 copy).
std::pair<at::Tensor, at::Tensor> Forward(const at::Tensor& h, const at::Tensor& lm_head, const at::Tensor& t,
                                          int64_t chunk) {
  const int64_t m = h.size(0);
  at::Tensor logps = at::empty({m}, h.options().dtype(at::kFloat));
  at::Tensor means = at::empty({m}, h.options().dtype(at::kFloat));
  for (int64_t start = 0; start < m; start += chunk) {
    const int64_t end = std::min(m, start + chunk);
    at::Tensor logits = ChunkLogits(h, lm_head, start, end);
    const at::Tensor target = logits.gather(1, t.slice(0, start, end).unsqueeze(1)).squeeze(1);
    means.slice(0, start, end).copy_(logits.mean({-1}));
    const at::Tensor top = std::get<0>(logits.max(-1, /*keepdim=*/true));
    const at::Tensor lse = logits.sub_(top).exp_().sum(-1).log_().add_(top.squeeze(1));
    logps.slice(0, start, end).copy_(target - lse);
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
      // softmax in place: exp(logits - max) / sum.
      at::Tensor grad_logits = ChunkLogits(h, lm_head, start, end);
      grad_logits.sub_(std::get<0>(grad_logits.max(-1, /*keepdim=*/true))).exp_();
      grad_logits.div_(grad_logits.sum(-1, /*keepdim=*/true));
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
  // Position p = r (seq - 1) + t of the grid is row r * seq + t of hidden's [rows x seq, hidden]
  // view (no copy of hidden's first seq - 1 columns).
  const at::Tensor rows_of_hidden = OnDeviceOf(index_here + at::floor_divide(index_here, seq - 1), hidden);
  const at::Tensor h = hidden.reshape({-1, hidden.size(2)}).index_select(0, rows_of_hidden);
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
