// The per-GPU memory budget that trainer.enable_gradient_checkpointing: auto and
// trainer.dequantized_weight_layers: auto plan for: trainer.max_memory_gib, else what this process
// could allocate when the job started (DeviceAvailableBytes; 0 on a CPU); and the host memory
// that offload_activation_layers: auto may pin: trainer.max_host_memory_gib, else the caller's
// default. Torch-free.
#pragma once

#include <cstdint>

#include "common/config/job_config.h"

namespace qlora::memory {

// `gib` GiB (2^30 bytes) in bytes where it is set (> 0), else `unset_bytes`.
inline int64_t GibOr(double gib, int64_t unset_bytes) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return gib > 0 ? static_cast<int64_t>(gib * kGiB) : unset_bytes;
}

inline int64_t MemoryBudgetBytes(const TrainerConfig& trainer, int64_t available_bytes) {
  return GibOr(trainer.max_memory_gib, available_bytes);
}

inline int64_t HostBudgetBytes(const TrainerConfig& trainer, int64_t default_bytes) {
  return GibOr(trainer.max_host_memory_gib, default_bytes);
}

}  // namespace qlora::memory
