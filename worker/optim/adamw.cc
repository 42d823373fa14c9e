// AdamW::Step follows torch/optim/adam.py `_single_tensor_adam` with decoupled weight decay, op
// for op, so that fp32 results agree with torch to rounding.
#include "worker/optim/adamw.h"

#include <cmath>

#include <ATen/ATen.h>

namespace qlora::optim {

AdamW::AdamW(const AdamWOptions& options, int64_t numel, const at::TensorOptions& device)
    : options_(options),
      exp_avg_(at::zeros({numel}, device.dtype(at::kFloat))),
      exp_avg_sq_(at::zeros({numel}, device.dtype(at::kFloat))) {}

void AdamW::Step(double lr, const at::Tensor& param, const at::Tensor& grad) {
  ++step_;
  const AdamWOptions& o = options_;
  param.mul_(1.0 - lr * o.weight_decay);
  exp_avg_.lerp_(grad, 1.0 - o.beta1);
  exp_avg_sq_.mul_(o.beta2).addcmul_(grad, grad, 1.0 - o.beta2);
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(step_));
  const double step_size = lr / bias_correction1;
  // One temporary (the same roundings as sqrt(v) / sqrt(bc2) + eps written out of place).
  at::Tensor denom = exp_avg_sq_.sqrt();
  denom.div_(std::sqrt(bias_correction2)).add_(o.eps);
  param.addcdiv_(exp_avg_, denom, -step_size);
}

int64_t AdamW::StateBytes() const {
  return static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
}

}  // namespace qlora::optim
