// The per-GPU memory budget that trainer.enable_gradient_checkpointing: auto and
// trainer.dequantized_weight_layers: auto plan for: trainer.max_memory_gib, else what this process
// could allocate when the job started (DeviceAvailableBytes; 0 on a CPU). Torch-free.
#pragma once

#include <cstdint>

#include "common/config/job_config.h"

namespace qlora::memory {

inline int64_t MemoryBudgetBytes(const TrainerConfig& trainer, int64_t available_bytes) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return trainer.max_memory_gib > 0 ? static_cast<int64_t>(trainer.max_memory_gib * kGiB)
                                    : available_bytes;
}

}  // namespace qlora::memory
