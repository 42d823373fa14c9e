// The chunked cross-entropy autograd function.
#include "worker/engine/causal_lm_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  // hidden [n, h], weight [v, h], targets [n] (already shifted; -100 = ignore).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets, int64_t chunk) {
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    for (int64_t start = 0; start < hidden.size(0); start += chunk) {
      const int64_t len = std::min(chunk, hidden.size(0) - start);
      const at::Tensor logits = at::linear(hidden.narrow(0, start, len), weight).to(at::kFloat);
      total += at::cross_entropy_loss(logits, targets.narrow(0, start, len), {},
                                      at::Reduction::Sum, kIgnoreIndex);
    }
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& targets = saved[2];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor grad_loss = grad_outputs[0].to(at::kFloat);
    at::Tensor grad_hidden = at::empty_like(hidden);
    for (int64_t start = 0; start < hidden.size(0); start += chunk) {
      const int64_t len = std::min(chunk, hidden.size(0) - start);
      const at::Tensor t = targets.narrow(0, start, len);
      const at::Tensor valid = t.ne(kIgnoreIndex);
      at::Tensor grad_logits =
          at::softmax(at::linear(hidden.narrow(0, start, len), weight).to(at::kFloat), -1);
      // d(sum CE)/d logits = softmax - onehot(target), zero on ignored rows.
      grad_logits.scatter_add_(1, t.clamp_min(0).unsqueeze(1),
                               at::full({len, 1}, -1.0, grad_logits.options()));
      grad_logits.mul_((valid.unsqueeze(1).to(at::kFloat)) * grad_loss);
      grad_hidden.narrow(0, start, len).copy_(at::matmul(grad_logits.to(hidden.scalar_type()), weight));
    }
    return {grad_hidden, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

CausalLmLoss ComputeCausalLmLoss(const at::Tensor& hidden, const at::Tensor& lm_head,
                                 const at::Tensor& labels, const LossOptions& options) {
  TORCH_CHECK(hidden.dim() == 3, "hidden must be [batch, seq, hidden]");
  TORCH_CHECK(labels.sizes() == hidden.sizes().slice(0, 2), "labels must be [batch, seq]");
  TORCH_CHECK(options.chunk_size > 0, "chunk_size must be positive");
  const int64_t batch = hidden.size(0), seq = hidden.size(1);
  // Position t predicts labels[t + 1]: drop the last position and the first label.
  const at::Tensor h = hidden.narrow(1, 0, seq - 1).reshape({batch * (seq - 1), hidden.size(2)});
  const at::Tensor targets =
      labels.to(hidden.device(), at::kLong).narrow(1, 1, seq - 1).reshape({batch * (seq - 1)});
  CausalLmLoss result;
  result.num_tokens = targets.ne(kIgnoreIndex).sum().item<int64_t>();
  result.loss_sum = ChunkedCrossEntropy::apply(h, lm_head.detach(), targets, options.chunk_size);
  return result;
}

}  // namespace qlora::engine
