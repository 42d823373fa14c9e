// Fills the device and host figures of a progress report: CUDA allocator statistics (allocated
// now, peak) and the process's resident set size.
#pragma once

#include <c10/core/Device.h>

#include "common/worker_protocol.h"

namespace qlora::worker {

void FillDeviceMemory(const c10::Device& device, MemorySnapshot* memory);

}  // namespace qlora::worker
