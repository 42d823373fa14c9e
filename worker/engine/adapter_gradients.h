// A LoRA node's adapter gradients computed in the compute dtype into one buffer and cast to the
// adapters' dtype (float32) by one kernel. A cast per gradient tensor was ~350 small kernels a
// 7B step (each A and B, and the q/k/v and gate/up As' block), each with the GPU's bubble between
// kernels after it. The values are the same: each GEMM still rounds its result to the compute
// dtype once, and the cast is exact.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::engine {

class AdapterGradients {
 public:
  // One slot per shape, each starting at a multiple of 8 values (16-byte aligned, as the tuned
  // GEMMs' operands must be), in a buffer of `options` (the compute dtype and device).
  AdapterGradients(const std::vector<std::vector<int64_t>>& shapes,
                   const at::TensorOptions& options);

  // Slot i as a contiguous tensor of its shape, for a GEMM to write.
  at::Tensor Slot(size_t i) const;
  // Every slot cast to `dtype` in one pass: one tensor per slot (views of one buffer). With
  // `first_slot_column_scale` ([last dim of slot 0], the buffer's dtype; float32 `dtype` only),
  // slot 0's values also times it along their last dim, in the same pass (each product rounded
  // once, as the cast followed by mul_ rounds it).
  std::vector<at::Tensor> Cast(at::ScalarType dtype,
                               const at::Tensor& first_slot_column_scale = at::Tensor()) const;

 private:
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;
  at::Tensor buffer_;
};

}  // namespace qlora::engine
