// Where a job's frozen base weights live on each rank when the job file leaves the ZeRO stage to
// the service (zero_optimization absent, or stage: auto): the first placement of
//   on device  stage 2: every rank holds the whole 4-bit model (no gather ever waits)
//   sharded    stage 3: each rank holds 1/world of every decoder layer's 4-bit bytes, a layer is
//              gathered whole a layer ahead of use (worker/engine/base_weight_store.h)
//   streamed   stage 3 with offload_param: the layers' shards wait in pinned host memory and are
//              copied to the device a layer ahead of use
// whose planned peak fits the budget less the activation plan's margin. The peak counts what the
// device holds once built (the placement's share of the base weights; embeddings, norms and
// lm_head whole on every rank; the adapters in the compute dtype and the strategy's fp32 master
// copy and AdamW state, partitioned across ranks) and a step's activations with every layer
// checkpointed, the least the activation plan can do (activation_plan.h): a placement that
// fits only with recomputation is still chosen, and enable_gradient_checkpointing: auto then
// finds the split. Where that is not enough (rows of hundreds of thousands of tokens), the
// least counts what the activation plan would do next: the checkpointed layers' MLPs in tiles,
// then (offload_activation_layers: auto) the fewest checkpointed inputs in host memory that
// fit, within what the host budget holds, so that a long row keeps its weights on the device
// when they fit so. It counts on the offloading that the worker's measurement of the host link
// then confirms: where that measurement fails, the job goes on without offloading and the
// activation plan says what no longer fits. Stage 2 is the floor: with LoRA, stages 0 and 1
// save nothing over it (the adapters' gradients are reduce-scattered instead of all-reduced,
// the same bytes on the wire).
//
// The budget is trainer.max_memory_gib, else the smallest of the ranks' GPUs' allocatable
// memory (and the host budget the smallest of the ranks'); without one (a CPU), stage 2. When
// even streaming does not fit, streaming is chosen and the reason says by how much it misses:
// the activation plan then refuses an auto job with its own figures, or the job tries as
// written. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "common/config/job_config.h"
#include "common/model/llama_config.h"
#include "worker/memory/activation_plan.h"

namespace qlora::memory {

enum class BaseWeightPlacement { kOnDevice, kSharded, kStreamed };

// "on device", "sharded", "streamed from host memory".
const char* PlacementName(BaseWeightPlacement placement);

// Bytes of the frozen weights, as the loader builds them in `quantization` (4-bit codes, block
// scales and the nested double-quantization state; dense in the compute dtype when off).
struct BaseWeightBytes {
  int64_t per_layer = 0;   // one decoder layer's projections (what stage 3 shards)
  int64_t outside = 0;     // embeddings, lm_head, every norm: whole on every rank's device
  int64_t total(int64_t layers) const { return per_layer * layers + outside; }
};
// input_embedding_on_host: an untied input embedding table waits in host memory
// (engine::LoadOptions::input_embedding_in_host_memory) and is not counted.
BaseWeightBytes FrozenWeightBytes(const LlamaConfig& model, const QuantizationConfig& quantization,
                                  int64_t dtype_bytes, bool input_embedding_on_host = false);

// The activation plan's request for a job before its model is built: the shape, the step's size,
// the adapters (the job's target modules, already expanded) and their trainable elements.
// `cuda`: the norms are fused nodes and dropout keeps a bool mask (activation_plan.h).
ActivationPlanRequest ActivationRequestFor(const JobConfig& job, const LlamaConfig& model,
                                           bool cuda);

struct BaseWeightPlanRequest {
  ActivationPlanRequest activations;  // built_bytes is this plan's to fill, per placement
  QuantizationConfig quantization;
  int world_size = 1;
  int64_t budget_bytes = 0;  // 0: no budget (stage 2)
  bool input_embedding_on_host = false;  // FrozenWeightBytes' flag
  bool adamw_moments_on_host = false;    // offload_optimizer: the moments are not counted
  // The checkpointed layers' MLPs may run in tiles (CheckpointingBudget::MayTileMlps).
  bool mlp_tiles = true;
  // offload_activation_layers: auto on a GPU: the host memory its offloaded activations may pin
  // (trainer.max_host_memory_gib, else the worker's default); 0: no offloading.
  int64_t activation_host_bytes = 0;
};

struct BaseWeightPlan {
  int zero_stage = 2;
  bool offload_param = false;
  BaseWeightPlacement placement = BaseWeightPlacement::kOnDevice;
  int64_t device_weight_bytes = 0;   // the base weights on the device at the peak
  // With every layer checkpointed, their MLPs in tiles and inputs offloaded as below (0: no
  // budget).
  int64_t planned_peak_bytes = 0;
  int64_t mlp_tile_rows = 0;         // of the plan behind planned_peak_bytes
  int64_t offloaded_inputs = 0;      // likewise
  int64_t budget_bytes = 0;
  // "stage 3, base weights sharded across 2 ranks: planned peak 21.0 GiB of a 24.0 GiB budget
  // (on device every rank would need 41.2 GiB)".
  std::string reason;
};

BaseWeightPlan PlanBaseWeights(const BaseWeightPlanRequest& request);

// The planned peak of one placement (PlanBaseWeights' figure for it), and the activations'
// choices behind it.
struct PlacementPeak {
  int64_t peak_bytes = 0;
  int64_t device_weight_bytes = 0;
  int64_t mlp_tile_rows = 0;
  int64_t offloaded_inputs = 0;
};
PlacementPeak PlannedPeakOf(const BaseWeightPlanRequest& request, BaseWeightPlacement placement);
int64_t PlannedPeakWith(const BaseWeightPlanRequest& request, BaseWeightPlacement placement,
                        int64_t* device_weight_bytes = nullptr);

}  // namespace qlora::memory
