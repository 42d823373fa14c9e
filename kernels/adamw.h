// One AdamW step over flat float32 tensors, in place: torch.optim.AdamW's single-tensor path
// (decoupled weight decay, bias correction, no amsgrad), op for op.
//
// CPU, and tensors the kernel does not take: the ATen ops of torch/optim/adam.py
// `_single_tensor_adam` (the oracle of tests/kernels/adamw_test.cc). CUDA (contiguous float32):
// one kernel reads each element of param, grad and the moments once and writes param and the
// moments once, where the ops make eight passes over them. Its arithmetic is the ops', in their
// order and float32 roundings (a scalar divisor as its float32 reciprocal, as ATen's CUDA division
// by a scalar does); where the compiler fuses a multiply-add differently from ATen's kernels the
// results differ in the last bit.
#pragma once

#include <cmath>
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

// The optimizer's own settings (worker/optim's AdamWOptions), torch.optim.AdamW's defaults.
struct AdamWHyperparameters {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// One step's: the settings, the learning rate and the step's number.
struct AdamWStepOptions : AdamWHyperparameters {
  double lr = 0;
  int64_t step = 1;  // from 1 (bias correction)
};

// The step's bias corrections, 1 - beta^step for each moment (in double, as torch computes them;
// the ops and the kernel take them from here).
struct AdamWBiasCorrections {
  double first, second;
};
inline AdamWBiasCorrections BiasCorrections(const AdamWStepOptions& o) {
  return {1.0 - std::pow(o.beta1, static_cast<double>(o.step)),
          1.0 - std::pow(o.beta2, static_cast<double>(o.step))};
}

// param, exp_avg and exp_avg_sq are updated from grad (all float32, one shape, one device).
// grad_factor: undefined, or a one-element float32 or float64 tensor on grad's device by which
// grad is multiplied first (the gradient-clipping coefficient: grad.mul_(grad_factor) before the
// step, except that grad itself is left as it is).
void AdamWStep(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
               const at::Tensor& exp_avg_sq, const AdamWStepOptions& options,
               const at::Tensor& grad_factor = at::Tensor());

}  // namespace qlora::kernels
