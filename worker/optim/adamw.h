// AdamW on one flat fp32 buffer, numerically the single-tensor path of torch.optim.AdamW
// (decoupled weight decay, bias correction, no amsgrad): the strategies call it on the part of
// the flattened parameters they own. The step itself is kernels/adamw.h (one CUDA kernel on the
// GPU, ATen's ops elsewhere).
//
// With MomentsPlacement::in_host (DeepSpeed's offload_optimizer: {device: cpu}), the two
// moments wait in host memory between steps: each step copies them to the parameters' device,
// runs the same kernel there and copies them back, all in the current stream's order, so the
// numbers are the device's own and the moments take no device memory through forward and
// backward (only during the update, when the activations are gone). On a CPU they are in host
// memory either way.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include "kernels/adamw.h"

namespace qlora::optim {

// beta1, beta2, eps, weight_decay (torch.optim.AdamW's defaults): the kernel's own settings.
using AdamWOptions = kernels::AdamWHyperparameters;

// Where the moments wait between steps.
struct MomentsPlacement {
  bool in_host = false;  // host memory (on a GPU; a CPU's are there anyway)
  // in_host: pinned, so the copies queue behind the step's work; pageable memory makes the host
  // wait for each step's copy back, and with it for everything queued before.
  bool pinned = true;
};

// Holds the moments of `numel` elements. Not thread-safe.
class AdamW {
 public:
  AdamW(const AdamWOptions& options, int64_t numel, const at::TensorOptions& device,
        const MomentsPlacement& placement = {});

  // One step with learning rate `lr`: updates `param` (fp32, numel elements, same device) in
  // place from `grad` and increments step(). grad_factor (undefined, or one float32/float64
  // element on grad's device: the clipping coefficient) multiplies grad first, as
  // grad.mul_(grad_factor) would, without writing grad.
  void Step(double lr, const at::Tensor& param, const at::Tensor& grad,
            const at::Tensor& grad_factor = at::Tensor());

  const AdamWOptions& options() const { return options_; }
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  // (numel,) fp32, on the device, or in host memory with in_host: then reading or writing
  // them first waits for the last step's copy back.
  at::Tensor& exp_avg();
  at::Tensor& exp_avg_sq();
  // Whether the moments wait in host memory between steps (MomentsPlacement::in_host on a GPU).
  bool moments_in_host() const { return host_moments_.defined(); }
  int64_t StateBytes() const;        // both moments, wherever they are
  int64_t DeviceStateBytes() const;  // of which held on the device between steps

 private:
  void AwaitCopyBack();

  AdamWOptions options_;
  // In host memory (undefined otherwise): one [2, numel rounded up to 4] buffer (pinned host memory is handed out in
  // powers of two: one rounding, not two), moved in one copy each way; exp_avg_ and exp_avg_sq_
  // are its rows.
  at::Tensor host_moments_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  int64_t step_ = 0;
  // Recorded after each step's copy back (one event, made at the first step); pending until
  // something waits for it.
  std::optional<c10::Event> copied_back_;
  bool copy_back_pending_ = false;
};

}  // namespace qlora::optim
