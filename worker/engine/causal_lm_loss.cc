// The chunked cross-entropy autograd function.
#include "worker/engine/causal_lm_loss.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cross_entropy.h"
#include "kernels/fused_elementwise.h"

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward takes each chunk's logits once: the kernel sums its token losses and turns the logits
// into their gradient in place, which one more GEMM takes to the chunk's hidden gradient. So
// forward keeps grad_hidden (the size of hidden, which it no longer keeps), and backward only
// rescales it by the incoming gradient over the one forward assumed (`grad_scale`): 1.0 exactly
// when they agree, so the result is rounded once, as when the gradient is formed in backward.
struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  // hidden [n, h], weight [v, h], targets [n] (already shifted; -100 = ignore).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const LossOptions& options, bool with_gradient) {
    at::Tensor grad_hidden = with_gradient ? at::empty_like(hidden) : at::Tensor();
    std::vector<at::Tensor> losses;
    kernels::CrossEntropyOptions ce;
    ce.ignore_index = kIgnoreIndex;
    ce.write_gradient = with_gradient;
    ce.grad_scale = options.grad_scale;
    for (int64_t start = 0; start < hidden.size(0); start += options.chunk_size) {
      const int64_t len = std::min(options.chunk_size, hidden.size(0) - start);
      at::Tensor logits = at::linear(hidden.narrow(0, start, len), weight);
      losses.push_back(
          kernels::CrossEntropyWithGradient(logits, targets.narrow(0, start, len), ce));
      if (with_gradient) {
        at::Tensor out = grad_hidden.narrow(0, start, len);
        at::mm_out(out, logits, weight);
      }
    }
    ctx->save_for_backward({grad_hidden});
    ctx->saved_data["grad_scale"] = options.grad_scale;
    return losses.empty() ? at::zeros({}, hidden.options().dtype(at::kFloat))
                          : at::cat(losses).sum();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor grad_hidden = ctx->get_saved_variables()[0];
    TORCH_CHECK(grad_hidden.defined(),
                "the causal-LM loss was computed without its gradient (no grad mode, or hidden "
                "did not require grad)");
    const at::Tensor ratio =
        grad_outputs[0].to(at::kFloat) / static_cast<float>(ctx->saved_data["grad_scale"].toDouble());
    // In place, each value's float32 product rounded to the gradient's dtype (as the float32
    // formula rounds it: kernels::ScaleInPlace), with no [tokens, hidden] float32 copy
    // at the start of backward, where every layer's activations are still held (on CUDA one
    // launch, which changes nothing where the ratio is 1).
    kernels::ScaleInPlace(grad_hidden, ratio);
    return {grad_hidden, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

CausalLmLoss ComputeCausalLmLoss(const at::Tensor& hidden, const at::Tensor& lm_head,
                                 const at::Tensor& labels, const LossOptions& options) {
  TORCH_CHECK(hidden.dim() == 3, "hidden must be [batch, seq, hidden]");
  TORCH_CHECK(labels.sizes() == hidden.sizes().slice(0, 2), "labels must be [batch, seq]");
  TORCH_CHECK(options.chunk_size > 0, "chunk_size must be positive");
  TORCH_CHECK(options.grad_scale != 0, "grad_scale must not be zero");
  const int64_t batch = hidden.size(0), seq = hidden.size(1);
  // Position t predicts labels[t + 1]; a row's last position predicts nothing (its target is
  // ignored, so its loss and gradient are 0). Every position goes in: hidden's rows as they are
  // (a view where hidden is contiguous), not a copy of all but the last, whose gradient would
  // then be scattered back into a zeroed tensor of hidden's shape.
  const at::Tensor h = hidden.reshape({batch * seq, hidden.size(2)});
  at::Tensor targets = at::full({batch, seq}, kIgnoreIndex,
                                at::TensorOptions().dtype(at::kLong).device(hidden.device()));
  if (seq > 1) {
    targets.narrow(1, 0, seq - 1)
        .copy_(labels.to(hidden.device(), at::kLong).narrow(1, 1, seq - 1));
  }
  targets = targets.view({batch * seq});
  CausalLmLoss result;
  if (options.count_tokens) result.num_tokens = targets.ne(kIgnoreIndex).sum().item<int64_t>();
  const bool with_gradient = at::GradMode::is_enabled() && hidden.requires_grad();
  result.loss_sum =
      ChunkedCrossEntropy::apply(h, lm_head.detach(), targets, options, with_gradient);
  return result;
}

}  // namespace qlora::engine
