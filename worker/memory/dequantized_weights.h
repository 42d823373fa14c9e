// trainer.dequantized_weight_layers on one rank: how many decoder layers hold their 4-bit
// weights dequantized for the job (worker/engine/dequantized_layers.h).
//
// A count sets that many (the first layers) before the first step (none for a model without 4-bit
// weights: the log says it is ignored). `auto` (a GPU) waits for the
// first step's measured peak (the larger of the allocator's peak allocation and reservation: the
// budget caps the reservation) and then sets as many as fit between it and the budget less 2 %:
// trainer.max_memory_gib, else what this process could allocate when the job started
// (DeviceAvailableBytes, as checkpointing's auto reads it). The dequantized layers only add memory, the
// same at every moment of a step, so the next steps peak at the first one's plus theirs, but
// with activation offloading on: a faster step lets the copies lag further behind, so auto also
// leaves the room the caller gives for one more offloaded layer's saved tensors
// (CheckpointingBudget::OffloadedLayerBytes: the 7B step with 8 or 10 plain layers offloaded
// peaked 0.7-0.9 GiB over the first step's peak plus the dequantized layers). On a CPU `auto` holds
// none (a CPU has no figure of its own to plan for). Torch side.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <c10/core/Device.h>

#include "common/config/job_config.h"
#include "worker/engine/llama_model.h"

namespace qlora::memory {

// The caching allocator's peaks so far: what it allocated, and what it reserved (the allocation
// and the fragments kept beside it; trainer.max_memory_gib caps this one).
struct AllocatorPeak {
  int64_t allocated = 0;
  int64_t reserved = 0;
};

struct DequantizedWeightsOptions {
  const TrainerConfig* trainer = nullptr;
  engine::LlamaForCausalLM* model = nullptr;  // its dequantized layers are set here
  c10::Device device = c10::Device(c10::kCPU);
  // The budget when trainer.max_memory_gib is unset: DeviceAvailableBytes (0 on a CPU).
  int64_t available_bytes = 0;
};

class DequantizedWeights {
 public:
  // Sets a count at once; returns the line for the log.
  static DequantizedWeights Start(const DequantizedWeightsOptions& options, std::string* line);

  // After a step (`step` 1-based in this run) with the allocator's peaks so far: auto's choice
  // after the first, fitted against the larger peak (at 34 GiB the allocator kept 1 GiB of
  // fragments beside the peak allocation: fitted against the allocation alone, a later step ran
  // out of memory), leaving `reserve_bytes` more room (one offloaded layer in transit, or 0)
  // and taking at most `limit_bytes` (what the checkpointing plan leaves:
  // CheckpointingBudget::RoomForFixedBytes). Returns the bytes the dequantized layers took then (for the
  // checkpointing plan's fixed part) and a line for the log in *line ("" when nothing changed).
  int64_t AfterStep(int64_t step, const AllocatorPeak& peak, int64_t reserve_bytes,
                    int64_t limit_bytes, std::string* line);

  // auto's choice for a peak and budget: the layers of `layer_bytes` each that fit in
  // min(budget x (1 - margin) - peak, limit) less `reserve_bytes`, at most `max_layers`.
  static int64_t FittingLayers(int64_t budget_bytes, int64_t peak_bytes, int64_t layer_bytes,
                               int64_t max_layers, int64_t reserve_bytes = 0,
                               int64_t limit_bytes = std::numeric_limits<int64_t>::max());

  static constexpr double kMarginFraction = 0.02;

 private:
  DequantizedWeights() = default;

  engine::LlamaForCausalLM* model_ = nullptr;
  bool pending_auto_ = false;  // auto on a GPU, before the first step's peak
  int64_t budget_bytes_ = 0;
};

}  // namespace qlora::memory
