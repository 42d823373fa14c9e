// ScalarRead: a non-blocking copy into pinned memory and an event recorded after it.
#include "worker/strategy/scalar_read.h"

#include <utility>

#include <ATen/ops/empty.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace qlora::strategy {

ScalarRead::ScalarRead(const at::Tensor& value) {
  const at::Tensor v = value.detach().reshape({-1});
  if (v.device().is_cpu()) {
    host_ = v.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);  // the value now
    return;
  }
  host_ = at::empty(v.sizes(), at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  host_.copy_(v, /*non_blocking=*/true);
  c10::Event event(v.device().type());
  const c10::impl::VirtualGuardImpl guard(v.device().type());
  event.record(guard.getStream(v.device()));
  copied_.emplace(std::move(event));
}

double ScalarRead::Get() const {
  if (!host_.defined()) return 0;
  if (copied_) copied_->synchronize();
  return host_.item<double>();
}

std::vector<double> ScalarRead::Values() const {
  if (!host_.defined()) return {};
  if (copied_) copied_->synchronize();
  const double* p = host_.data_ptr<double>();
  return std::vector<double>(p, p + host_.numel());
}

}  // namespace qlora::strategy
