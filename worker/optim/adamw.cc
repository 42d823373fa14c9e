// AdamW: the moments and the step count; the step's arithmetic is kernels/adamw.h (torch/optim/
// adam.py `_single_tensor_adam` with decoupled weight decay, op for op). Moments in host memory
// travel to the device and back around each step in the current stream's order.
#include "worker/optim/adamw.h"

#include <utility>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace qlora::optim {

AdamW::AdamW(const AdamWOptions& options, int64_t numel, const at::TensorOptions& device,
             const MomentsPlacement& placement)
    : options_(options), in_host_(placement.in_host && !device.device().is_cpu()) {
  const at::TensorOptions where =
      in_host_ ? at::TensorOptions().dtype(at::kFloat).pinned_memory(placement.pinned)
               : device.dtype(at::kFloat);
  exp_avg_ = at::zeros({numel}, where);
  exp_avg_sq_ = at::zeros({numel}, where);
}

void AdamW::Step(double lr, const at::Tensor& param, const at::Tensor& grad,
                 const at::Tensor& grad_factor) {
  ++step_;
  kernels::AdamWStepOptions o;
  static_cast<kernels::AdamWHyperparameters&>(o) = options_;
  o.lr = lr;
  o.step = step_;
  if (!in_host_) {
    kernels::AdamWStep(param, grad, exp_avg_, exp_avg_sq_, o, grad_factor);
    return;
  }
  // Stream-ordered throughout, so the host never waits: the last step's copies back, these
  // copies in, the kernel, the copies back. The device copies are freed here, and the caching
  // allocator hands their blocks only to work queued after the copies back on this stream.
  at::Tensor m = exp_avg_.to(param.device(), /*non_blocking=*/true);
  at::Tensor v = exp_avg_sq_.to(param.device(), /*non_blocking=*/true);
  kernels::AdamWStep(param, grad, m, v, o, grad_factor);
  exp_avg_.copy_(m, /*non_blocking=*/true);
  exp_avg_sq_.copy_(v, /*non_blocking=*/true);
  c10::Event event(param.device().type());
  const c10::impl::VirtualGuardImpl guard(param.device().type());
  event.record(guard.getStream(param.device()));
  copied_back_.emplace(std::move(event));
}

void AdamW::AwaitCopyBack() {
  if (copied_back_) copied_back_->synchronize();
  copied_back_.reset();
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
  return static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
}

int64_t AdamW::DeviceStateBytes() const { return in_host_ ? 0 : StateBytes(); }

}  // namespace qlora::optim
