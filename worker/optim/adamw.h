// AdamW on one flat fp32 buffer, numerically the single-tensor path of torch.optim.AdamW
// (decoupled weight decay, bias correction, no amsgrad): the strategies call it on the part of
// the flattened parameters they own. The step itself is kernels/adamw.h (one CUDA kernel on the
// GPU, ATen's ops elsewhere).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "kernels/adamw.h"

namespace qlora::optim {

// beta1, beta2, eps, weight_decay (torch.optim.AdamW's defaults): the kernel's own settings.
using AdamWOptions = kernels::AdamWHyperparameters;

// Holds the moments of `numel` elements. Not thread-safe.
class AdamW {
 public:
  AdamW(const AdamWOptions& options, int64_t numel, const at::TensorOptions& device);

  // One step with learning rate `lr`: updates `param` (fp32, numel elements, same device) in
  // place from `grad` and increments step(). grad_factor (undefined, or one float32/float64
  // element on grad's device: the clipping coefficient) multiplies grad first, as
  // grad.mul_(grad_factor) would, without writing grad.
  void Step(double lr, const at::Tensor& param, const at::Tensor& grad,
            const at::Tensor& grad_factor = at::Tensor());

  const AdamWOptions& options() const { return options_; }
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  at::Tensor& exp_avg() { return exp_avg_; }        // (numel,) fp32
  at::Tensor& exp_avg_sq() { return exp_avg_sq_; }  // (numel,) fp32
  int64_t StateBytes() const;

 private:
  AdamWOptions options_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace qlora::optim
