// ScalarRead: a one-element tensor's value (or a few values: Values()) read by the host without
// draining the device's stream.
// The copy is queued where the value is final (a loss after its forward, a gradient norm before
// the optimizer's kernels), and Get() waits for that copy only, not for the work queued after
// it: the host goes on queueing the next step while the GPU finishes this one. Either way Get()
// gives the value as it was when the read was made.
#pragma once

#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

namespace qlora::strategy {

class ScalarRead {
 public:
  ScalarRead() = default;
  // Queues the copy of `value` (any floating or integral dtype) on its device's current stream.
  explicit ScalarRead(const at::Tensor& value);

  // The value as a double, once its copy is done (a one-element read); 0 for a
  // default-constructed read.
  double Get() const;
  // Every element as doubles, flattened, once the copy is done; empty for a default-constructed
  // read.
  std::vector<double> Values() const;

 private:
  at::Tensor host_;                // float64: pinned (a device value's copy), or a CPU copy
  std::optional<c10::Event> copied_;
};

}  // namespace qlora::strategy
