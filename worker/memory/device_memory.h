// Fills the device and host figures of a progress report: CUDA allocator statistics (allocated
// now, peak) and the process's resident set size; the peak of a run; what a GPU has left.
#pragma once

#include <c10/core/Device.h>

#include "common/worker_protocol.h"

namespace qlora::memory {

void FillDeviceMemory(const c10::Device& device, MemorySnapshot* memory);

// This process's peak memory for the end-of-run summary: the CUDA allocator's peak allocation
// on a GPU, the peak resident set size (getrusage) on the CPU.
int64_t PeakMemoryBytes(const c10::Device& device);

// A GPU: the caching allocator's bytes allocated now. 0 on the CPU.
int64_t DeviceAllocatedBytes(const c10::Device& device);

// A GPU: caps the caching allocator at `bytes` (trainer.max_memory_gib): past it, the allocator
// frees what it caches and tries again before it reports out of memory, so the process holds no
// more than a card of that size would let it (reserved, not only allocated). Returns the cap set
// (0: none: a CPU, `bytes` <= 0, or at least the whole device).
int64_t CapDeviceMemory(const c10::Device& device, int64_t bytes);

// A GPU: what this process can still allocate in all, the device's free memory plus what the
// caching allocator holds already (reserved). 0 on the CPU.
int64_t DeviceAvailableBytes(const c10::Device& device);

}  // namespace qlora::memory
