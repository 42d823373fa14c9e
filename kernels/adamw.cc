// Entry point of adamw.h: the CUDA kernel where it takes the tensors, else the ATen ops.
#include "kernels/adamw.h"

#include <cmath>

#include <ATen/ATen.h>

#ifdef QLORA_HAVE_CUDA
#include "kernels/adamw_backend.h"
#endif

namespace qlora::kernels {

void AdamWStep(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
               const at::Tensor& exp_avg_sq, const AdamWStepOptions& o,
               const at::Tensor& grad_factor) {
  TORCH_CHECK(param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat &&
                  exp_avg.scalar_type() == at::kFloat && exp_avg_sq.scalar_type() == at::kFloat,
              "AdamW: param, grad and moments must be float32");
  TORCH_CHECK(grad.sizes() == param.sizes() && exp_avg.sizes() == param.sizes() &&
                  exp_avg_sq.sizes() == param.sizes(),
              "AdamW: param ", param.sizes(), ", grad ", grad.sizes(), " and moments ",
              exp_avg.sizes(), " / ", exp_avg_sq.sizes(), " must have one shape");
  TORCH_CHECK(o.step >= 1, "AdamW: steps count from 1, got ", o.step);
  TORCH_CHECK(!grad_factor.defined() || grad_factor.numel() == 1,
              "AdamW: grad_factor must have one element, got ", grad_factor.sizes());
#ifdef QLORA_HAVE_CUDA
  if (cuda::AdamWStep(param, grad, exp_avg, exp_avg_sq, o, grad_factor)) return;
#endif
  const at::Tensor g = grad_factor.defined() ? grad * grad_factor.reshape({}) : grad;
  at::Tensor p = param, m = exp_avg, v = exp_avg_sq;
  p.mul_(1.0 - o.lr * o.weight_decay);
  m.lerp_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  const AdamWBiasCorrections bias = BiasCorrections(o);
  const double step_size = o.lr / bias.first;
  // One temporary (the same roundings as sqrt(v) / sqrt(bc2) + eps written out of place).
  at::Tensor denom = v.sqrt();
  denom.div_(std::sqrt(bias.second)).add_(o.eps);
  p.addcdiv_(m, denom, -step_size);
}

}  // namespace qlora::kernels
