// Fills the device and host figures of a progress report: CUDA allocator statistics (allocated
// now, peak) and the process's resident set size; and the peak of a run.
#pragma once

#include <c10/core/Device.h>

#include "common/worker_protocol.h"

namespace qlora::worker {

void FillDeviceMemory(const c10::Device& device, MemorySnapshot* memory);

// This process's peak memory for the end-of-run summary: the CUDA allocator's peak allocation
// on a GPU, the peak resident set size (getrusage) on the CPU.
int64_t PeakMemoryBytes(const c10::Device& device);

}  // namespace qlora::worker
