// AdamW: the moments and the step count; the step's arithmetic is kernels/adamw.h (torch/optim/
// adam.py `_single_tensor_adam` with decoupled weight decay, op for op). Moments in host memory
// travel to the device and back around each step in the current stream's order.
#include "worker/optim/adamw.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace qlora::optim {

AdamW::AdamW(const AdamWOptions& options, int64_t numel, const at::TensorOptions& device,
             const MomentsPlacement& placement)
    : options_(options) {
  if (!placement.in_host || device.device().is_cpu()) {
    exp_avg_ = at::zeros({numel}, device.dtype(at::kFloat));
    exp_avg_sq_ = at::zeros({numel}, device.dtype(at::kFloat));
    return;
  }
  // Rows of a multiple of 4 elements, so that the second stays 16-byte aligned (the kernel's
  // vectorized path).
  host_moments_ = at::zeros({2, (numel + 3) / 4 * 4},
                            at::TensorOptions().dtype(at::kFloat).pinned_memory(placement.pinned));
  exp_avg_ = host_moments_[0].narrow(0, 0, numel);
  exp_avg_sq_ = host_moments_[1].narrow(0, 0, numel);
}

void AdamW::Step(double lr, const at::Tensor& param, const at::Tensor& grad,
                 const at::Tensor& grad_factor) {
  ++step_;
  kernels::AdamWStepOptions o;
  static_cast<kernels::AdamWHyperparameters&>(o) = options_;
  o.lr = lr;
  o.step = step_;
  if (!moments_in_host()) {
    kernels::AdamWStep(param, grad, exp_avg_, exp_avg_sq_, o, grad_factor);
    return;
  }
  // Stream-ordered throughout, so the host does not wait: the last step's copy back, this copy
  // in, the kernel, the copy back. The device copy is freed here, and the caching allocator
  // hands its block only to work queued after the copy back on this stream.
  const at::Tensor moments = host_moments_.to(param.device(), /*non_blocking=*/true);
  const int64_t numel = exp_avg_.numel();
  kernels::AdamWStep(param, grad, moments[0].narrow(0, 0, numel), moments[1].narrow(0, 0, numel),
                     o, grad_factor);
  host_moments_.copy_(moments, /*non_blocking=*/true);
  const c10::impl::VirtualGuardImpl guard(param.device().type());
  if (!copied_back_) copied_back_.emplace(param.device().type());
  copied_back_->record(guard.getStream(param.device()));
  copy_back_pending_ = true;
}

void AdamW::AwaitCopyBack() {
  if (copy_back_pending_) copied_back_->synchronize();
  copy_back_pending_ = false;
}

at::Tensor& AdamW::exp_avg() {
  AwaitCopyBack();
  return exp_avg_;
}

at::Tensor& AdamW::exp_avg_sq() {
  AwaitCopyBack();
  return exp_avg_sq_;
}

int64_t AdamW::StateBytes() const {
  return static_cast<int64_t>(moments_in_host() ? host_moments_.nbytes()
                                                : exp_avg_.nbytes() + exp_avg_sq_.nbytes());
}

int64_t AdamW::DeviceStateBytes() const { return moments_in_host() ? 0 : StateBytes(); }

}  // namespace qlora::optim
