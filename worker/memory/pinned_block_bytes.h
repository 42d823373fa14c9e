// How many bytes a pinned host block of the activation offloader takes for a request
// (engine::PinnedBlockPool): whole 4 KiB pages up to 1 MiB, above that a multiple of an eighth
// of the request's power of two. Torch's caching host allocator rounds every block up to a power
// of two, which can double the host memory that long rows' checkpoints take; an eighth keeps
// the waste under 12.5 % with few enough sizes that blocks are reused from step to step.
// Torch-free: the offload plan counts host memory with it.
#pragma once

#include <cstdint>

namespace qlora::memory {

inline constexpr int64_t kPinnedPage = int64_t{4} << 10;
// The most a block takes over its request, as a factor (the plan's host-memory bound).
inline constexpr double kPinnedBlockOverhead = 1.125;

inline int64_t PinnedBlockBytes(int64_t bytes) {
  if (bytes <= 0) return 0;
  int64_t step = kPinnedPage;
  if (bytes > (int64_t{1} << 20)) {
    int64_t power = int64_t{1} << 20;
    while (power <= bytes / 2) power *= 2;  // the largest power of two <= bytes
    step = power / 8;
  }
  return (bytes + step - 1) / step * step;
}

}  // namespace qlora::memory
