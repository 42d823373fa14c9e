// trainer.enable_gradient_checkpointing on one rank: true sets every layer (but the top one when
// the plan shows its recomputation lowers no peak), false none;
// auto plans the split for the memory budget (worker/memory/activation_plan.h) once the model, the
// adapters and the optimizer are built, and corrects it from what the first steps measure.
//
// The budget: trainer.max_memory_gib, else (a GPU) what this process could allocate when the plan
// is made, the device's free memory plus what the caching allocator holds (the model is counted in
// the plan, so this is what was free when the worker started less the CUDA context and NCCL).
// A CPU worker with auto and no budget checkpoints every layer (a CPU has no figure of its own
// to plan for; the host's RAM is shared with everything else).
//
// trainer.offload_activation_layers (a GPU): a count places that many layers (activation_offload_plan.h and
// LlamaForCausalLM::SetOffloadedLayers); auto measures the rates once and offloads what the host
// link can carry where it spares recomputation: with true, up to the checkpointed layers; with
// auto, the plan that recomputes the fewest layers in the budget (PlanCheckpointingWithOffload);
// with false none.
//
// Correction (a GPU): after each of the first two steps, the allocator's peak is compared with
// the plan (the process's peak so far: the second step counts only where it went higher than the
// first, which was corrected for already). A peak above the plan raises the plan's fixed part by
// the difference and plans again; when that needs more checkpointed layers, the next steps use
// them (the split only ever grows towards all checkpointed: each split computes the same
// values). The peak before the first step (loading) is remembered so that only a peak a step set
// counts. Torch side.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "common/worker_protocol.h"
#include "worker/engine/llama_model.h"
#include "worker/memory/activation_plan.h"
#include "worker/memory/activation_offload_plan.h"

namespace qlora::memory {

struct CheckpointingBudgetOptions {
  const JobConfig* config = nullptr;
  engine::LlamaForCausalLM* model = nullptr;  // its split is set here
  c10::Device device = c10::Device(c10::kCPU);
  int64_t trainable_elements = 0;
  // Bytes the strategy holds (master, AdamW state, gradient buffers): counted on a CPU, where no
  // allocator measures them.
  int64_t strategy_bytes = 0;
  // The budget when trainer.max_memory_gib is unset: DeviceAvailableBytes (0 on a CPU).
  int64_t available_bytes = 0;
  // Allocated now (the model, adapters and strategy), on a GPU; 0: counted from the tensors.
  int64_t allocated_bytes = 0;
  int64_t peak_bytes = 0;  // the allocator's peak so far (loading), on a GPU
  // offload_activation_layers: auto on a GPU with checkpointing: the host link, the GEMM rate and
  // the host memory the offloaded tensors may take, measured before (engine/offload_rates.h; so
  // that peak_bytes counts the measurement), or why they could not be (then nothing is offloaded,
  // and the log line says why). Unset: not measured, nothing offloaded.
  std::optional<absl::StatusOr<memory::OffloadRates>> offload_rates;
};

class CheckpointingBudget {
 public:
  // Whether Start uses measured offload rates for this job on `device`
  // (CheckpointingBudgetOptions::offload_rates): offload_activation_layers: auto on a GPU, with
  // layers to spare from recomputation (checkpointing true or auto).
  static bool UsesOffloadRates(const TrainerConfig& trainer, const c10::Device& device);

  // Whether Start may run checkpointed layers' MLPs in tiles where whole ones overrun the budget:
  // checkpointing auto (its plan tiles anywhere), or true on a GPU (where it sees the room).
  static bool MayTileMlps(const TrainerConfig& trainer, const c10::Device& device);

  // Sets the model's split. FailedPrecondition when auto's budget is below what every layer
  // checkpointed needs (the message names both).
  static absl::StatusOr<CheckpointingBudget> Start(const CheckpointingBudgetOptions& options);

  // What was chosen, as the log line and the progress report say it.
  std::string Describe() const;
  std::string DescribeSplit() const;  // Describe without the offloaded layers
  CheckpointingReport Report() const;

  // After a step (`step` 1-based in this run) with the allocator's peak so far (GPU only). Returns
  // a line for the log when it measured or changed something, else "".
  std::string AfterStep(int64_t step, int64_t peak_bytes);

  // Bytes held from now on that the plan did not count (dequantized weights, set after the first
  // step: dequantized_weights.h), added to its fixed part and its planned peak, so that the next
  // steps' peaks are compared with a plan that counts them.
  void AddFixedBytes(int64_t bytes);
  // How many bytes AddFixedBytes may add after a step that peaked at `peak_bytes` without the
  // plan leaving its margin (the budget less its margin less the larger of that peak and the
  // planned one; 0 when none is left); no limit (INT64_MAX) where nothing is planned. What
  // dequantized_weight_layers: auto may take beside enable_gradient_checkpointing: auto.
  int64_t RoomForFixedBytes(int64_t peak_bytes) const;
  // One offloaded layer's saved tensors in a micro-batch, as the plan counts them (0 when no layer
  // is offloaded): the room dequantized_weight_layers: auto leaves for the copies in transit.
  int64_t OffloadedLayerBytes() const;
  // The same for a request: the plan's bytes of a plain layer at its micro-batch and sequence.
  static int64_t OffloadedLayerBytes(const memory::ActivationPlanRequest& request);

 private:
  CheckpointingBudget() = default;

  engine::LlamaForCausalLM* model_ = nullptr;
  bool automatic_ = false;
  int64_t offload_requested_ = 0;    // trainer.offload_activation_layers (GPU workers only)
  bool offload_auto_ = false;        // offload_activation_layers: auto
  std::optional<memory::OffloadRates> offload_rates_;  // measured for auto on a GPU
  std::string offload_unmeasured_;   // why the rates could not be measured (then none offloaded)
  bool planned_ = false;             // auto with a budget (else: every layer, nothing to correct)
  memory::ActivationPlanRequest request_;
  memory::ActivationPlan plan_;
  int64_t peak_before_ = 0;
  int64_t measured_peak_ = 0;        // the largest peak a step set (0: none measured)
};

}  // namespace qlora::memory
