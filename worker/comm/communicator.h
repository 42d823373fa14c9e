// The collective-communication interface the strategies use: it moves bytes between the ranks of
// one job and knows nothing of ZeRO. Backends: Gloo (CPU tensors, gloo_communicator.h) and NCCL
// (CUDA tensors, nccl_communicator.h).
//
// Every collective takes a timeout; every rank must call the same collectives in the same order.
// A failure is an absl::Status naming this rank, the operation and, when the backend can tell,
// the rank(s) that were missing (DEADLINE_EXCEEDED for a timeout). After a failure the
// communicator is broken: later calls return FAILED_PRECONDITION and the job must rendezvous
// again under a new generation.
//
// Tensors must be dense and contiguous, on the backend's device; supported dtypes are float32,
// float64 and int64 (NCCL adds bfloat16/float16). Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace qlora::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: on return every rank's `tensor` holds the element-wise sum over all ranks.
  virtual absl::Status AllReduceSum(const at::Tensor& tensor, absl::Duration timeout) = 0;

  // `input` holds sum(counts) elements on every rank, segment r being counts[r] elements starting
  // at counts[0] + ... + counts[r-1]. On return this rank's `output` (counts[rank()] elements)
  // holds the sum over ranks of its segment. Counts may differ and may be zero; `input` is not
  // modified.
  virtual absl::Status ReduceScatterSum(const at::Tensor& input, const at::Tensor& output,
                                        absl::Span<const int64_t> counts,
                                        absl::Duration timeout) = 0;

  // `output` holds world_size() * input.numel() elements; rank r's `input` lands at
  // [r * n, (r + 1) * n).
  virtual absl::Status AllGather(const at::Tensor& input, const at::Tensor& output,
                                 absl::Duration timeout) = 0;

  // In place: on return every rank's `tensor` equals `root`'s.
  virtual absl::Status Broadcast(const at::Tensor& tensor, int root, absl::Duration timeout) = 0;

  virtual absl::Status Barrier(absl::Duration timeout) = 0;
};

}  // namespace qlora::comm
