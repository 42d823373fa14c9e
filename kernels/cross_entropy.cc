// Entry point of cross_entropy.h: the ATen formula (CPU, and the fallback) and dispatch to the
// CUDA kernel.
#include "kernels/cross_entropy.h"

#include <ATen/ATen.h>

#include "kernels/cross_entropy_backend.h"
#include "kernels/quantize_4bit.h"

namespace qlora::kernels {

at::Tensor CrossEntropyWithGradient(at::Tensor& logits, const at::Tensor& targets,
                                    const CrossEntropyOptions& options) {
  TORCH_CHECK(logits.dim() == 2, "cross entropy: logits must be [rows, vocab], got ",
              logits.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                  targets.scalar_type() == at::kLong && targets.device() == logits.device(),
              "cross entropy: targets must be int64 [rows] on the logits' device");
  TORCH_CHECK(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kHalf ||
                  logits.scalar_type() == at::kBFloat16,
              "cross entropy: logits must be float32, float16 or bfloat16");
  TORCH_CHECK(logits.stride(1) == 1 && logits.stride(0) == logits.size(1),
              "cross entropy: logits must be contiguous");
  if (logits.is_cuda() && HasCudaKernels()) {
#ifdef QLORA_HAVE_CUDA
    at::Tensor losses = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
    if (cuda::CrossEntropyWithGradient(logits, targets.contiguous(), options.ignore_index,
                                       options.write_gradient,
                                       static_cast<float>(options.grad_scale), losses)) {
      return losses;
    }
#endif
  }
  const at::Tensor z = logits.to(at::kFloat);
  const at::Tensor valid = targets.ne(options.ignore_index);
  const at::Tensor safe = targets.clamp_min(0).unsqueeze(1);
  const at::Tensor lse = z.logsumexp(1, /*keepdim=*/true);
  const at::Tensor losses = ((lse - z.gather(1, safe)).squeeze(1)).where(valid, 0.0f);
  if (options.write_gradient) {
    at::Tensor grad = (z - lse).exp_();
    grad.scatter_add_(1, safe, at::full({z.size(0), 1}, -1.0f, grad.options()));
    grad.mul_(valid.unsqueeze(1).to(at::kFloat) * static_cast<float>(options.grad_scale));
    logits.copy_(grad);
  }
  return losses;
}

}  // namespace qlora::kernels
