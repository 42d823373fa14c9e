// AdamW: the moments and the step count; the step's arithmetic is kernels/adamw.h (torch/optim/
// adam.py `_single_tensor_adam` with decoupled weight decay, op for op).
#include "worker/optim/adamw.h"

#include <ATen/ATen.h>

namespace qlora::optim {

AdamW::AdamW(const AdamWOptions& options, int64_t numel, const at::TensorOptions& device)
    : options_(options),
      exp_avg_(at::zeros({numel}, device.dtype(at::kFloat))),
      exp_avg_sq_(at::zeros({numel}, device.dtype(at::kFloat))) {}

void AdamW::Step(double lr, const at::Tensor& param, const at::Tensor& grad,
                 const at::Tensor& grad_factor) {
  ++step_;
  kernels::AdamWStepOptions o;
  static_cast<kernels::AdamWHyperparameters&>(o) = options_;
  o.lr = lr;
  o.step = step_;
  kernels::AdamWStep(param, grad, exp_avg_, exp_avg_sq_, o, grad_factor);
}

int64_t AdamW::StateBytes() const {
  return static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
}

}  // namespace qlora::optim
