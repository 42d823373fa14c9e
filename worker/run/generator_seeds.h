// Deterministic randomness per step. libtorch seeds its default generators from the OS, and LoRA
// dropout draws from them. Seeding them from (job seed, rank, step) before every step gives each
// rank its own masks and makes a run resumed from a checkpoint draw exactly what an
// uninterrupted one does. Torch side.
#pragma once

#include <cstdint>

#include <c10/core/Device.h>

namespace qlora::worker {

void SeedGeneratorsForStep(const at::Device& device, uint64_t job_seed, int rank, int64_t step);

}  // namespace qlora::worker
