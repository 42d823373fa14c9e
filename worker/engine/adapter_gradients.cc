// AdapterGradients (see adapter_gradients.h).
#include "worker/engine/adapter_gradients.h"

#include <ATen/ATen.h>

#include "kernels/fused_elementwise.h"

namespace qlora::engine {
namespace {

constexpr int64_t kSlotAlignment = 8;  // values: 16 bytes in bf16

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

AdapterGradients::AdapterGradients(const std::vector<std::vector<int64_t>>& shapes,
                                   const at::TensorOptions& options)
    : shapes_(shapes) {
  int64_t total = 0;
  for (const std::vector<int64_t>& shape : shapes_) {
    offsets_.push_back(total);
    total += (Numel(shape) + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  }
  buffer_ = at::empty({total}, options);
}

at::Tensor AdapterGradients::Slot(size_t i) const {
  return buffer_.narrow(0, offsets_[i], Numel(shapes_[i])).view(shapes_[i]);
}

std::vector<at::Tensor> AdapterGradients::Cast(at::ScalarType dtype,
                                               const at::Tensor& first_slot_column_scale) const {
  at::Tensor cast;
  if (first_slot_column_scale.defined()) {
    TORCH_CHECK(dtype == at::kFloat && !shapes_.empty() && !shapes_[0].empty() &&
                    first_slot_column_scale.numel() == shapes_[0].back(),
                "AdapterGradients: a column scale needs float32 and slot 0's last dim");
    cast = at::empty({buffer_.numel()}, buffer_.options().dtype(dtype));
    kernels::CastScalingLeadingRows(buffer_, cast, Numel(shapes_[0]) / shapes_[0].back(),
                                    first_slot_column_scale);
  } else {
    cast = buffer_.to(dtype);
  }
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < shapes_.size(); ++i) {
    out.push_back(cast.narrow(0, offsets_[i], Numel(shapes_[i])).view(shapes_[i]));
  }
  return out;
}

}  // namespace qlora::engine
