// How many decoder layers to offload (trainer.offload_activation_layers: auto). Torch-free: a
// model of the host link's time, from the memory plan's bytes (activation_plan.h) and rates the
// worker measures on its GPU (offload_rates.h).
//
// An offloaded layer's saved tensors (and, with offloading on, every other checkpointed layer's
// input) travel to host memory on a copy engine of their own, and back during backward. Offloading
// pays while the link keeps up; past that the step waits for it. Three windows (the offloaded
// layers lie in the lowest `region` layers):
//   out      from the forward's start until backward reaches the region: the forward, then the
//            backward of the layers above the region;
//   backlog  what the region's forward makes beyond what the link moves meanwhile must stay under
//            the offloader's pending limit, else the host waits for the copies and the GPU drains;
//   back     the region's backward (its layers' backward, the recomputation of those not
//            offloaded) and the two layers above it, where the first prefetch starts.
// Why three: at 7B micro-batch 4 with 31 layers checkpointed the gain peaked where the out window
// fills; with 13 checkpointed under a 24 GiB budget, the count from a model of the out window
// alone made the step slower than none, that from out and back faster, but by less than the
// recomputation it spared: the backlog (bench/reports/llama7b_h200_2026-12-01.md). The 70B-width
// slice at micro-batch 1 did best with 5 of 6 layers offloaded.
// The layers' times are estimated from their FLOPs at the measured GEMM rate over the GEMMs'
// share of a forward, backward a fixed multiple of forward. Host memory bounds the count too, each
// pinned block counted at the most its rounding may take (pinned_block_bytes.h: an eighth more).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/memory/activation_plan.h"

namespace qlora::memory {

struct OffloadRates {
  double host_link_bytes_per_s = 0;  // pinned copies, the slower of to and from the device
  double gemm_flops_per_s = 0;       // a warm bf16 GEMM of the model's MLP shape
  int64_t host_bytes = 0;            // host memory the offloaded tensors may take
  // Device bytes the offloader lets wait for their copy before the host waits
  // (ActivationOffloadOptions::max_pending_bytes).
  int64_t max_pending_bytes = int64_t{2} << 30;
};

// The base GEMMs' share of a forward's time (from the profile of a 7B micro-batch-4 step without
// checkpointing; attention and the elementwise kernels take the rest).
inline constexpr double kGemmShareOfForward = 0.75;
// A layer's backward over its forward without recomputation (from the same profile; the frozen
// base has no weight gradients).
inline constexpr double kBackwardOverForward = 1.2;

// Forward FLOPs per token of one decoder layer: its seven projections and causal attention.
double LayerForwardFlopsPerToken(const ActivationPlanRequest& request);

// The most layers (at most layers - 1: never the top one) whose copies the link keeps up with and
// the host memory holds, with `checkpointed_layers` checkpointed (their inputs travel too). 0
// when the rates are unknown.
int64_t OffloadableLayers(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                          const OffloadRates& rates);

// enable_gradient_checkpointing: true with offload_activation_layers: auto: the most of the
// OffloadableLayers of the `checkpointed_layers` whose planned peak fits `device_bytes` (the
// job's budget: max_memory_gib, else the GPU's free memory) less the plan's margin; where none
// does, the count with the lowest peak, or none where every count raises it (offloading lowers
// the peak where layers are narrow and rows many, raises it where layers are wide and rows few:
// the 70B-width slice; offloaded neighbours put two layers in transit: rows of 16,384).
int64_t OffloadAmongCheckpointed(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                                 const OffloadRates& rates, int64_t device_bytes);

// The most checkpointed layers' inputs (with no layer offloaded) whose copies the link keeps up
// with and the host memory holds. 0 when the rates are unknown.
int64_t OffloadableInputs(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                          const OffloadRates& rates);

// The most checkpointed layers' inputs (with no layer offloaded) whose pinned copies `host_bytes`
// holds, the link aside: what the stage plan (base_weight_plan.h) may count on before the rates
// are measured.
int64_t InputsTheHostHolds(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                           int64_t host_bytes);

// With no layer offloaded: 0 when the planned peak fits `device_bytes` less the margin with every
// checkpointed input on the device, else the fewest inputs offloaded (up to `most`) for which it
// does, else `most` (the lowest peak allowed).
int64_t FewestInputsThatFit(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                            int64_t most, int64_t device_bytes);

// enable_gradient_checkpointing: true with offload_activation_layers: auto where no layer is
// offloaded (OffloadAmongCheckpointed gave none): 0 when the planned peak fits `device_bytes`
// less the margin with every input on the device, else the fewest inputs offloaded for which it
// does, or OffloadableInputs where none does (the lowest peak the host allows).
int64_t InputsAmongCheckpointed(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                                const OffloadRates& rates, int64_t device_bytes);

// enable_gradient_checkpointing: true with offload_activation_layers: auto, both choices above:
// OffloadAmongCheckpointed's layers (every checkpointed input travelling with them), or, where
// their plan overruns the budget and the inputs alone plan lower (no layer in transit), or none
// is offloaded, InputsAmongCheckpointed's inputs alone.
struct CheckpointedOffload {
  int64_t layers = 0;
  int64_t inputs = -1;  // ActivationPlanRequest::offloaded_inputs
};
CheckpointedOffload OffloadForCheckpointed(const ActivationPlanRequest& request,
                                           int64_t checkpointed_layers, const OffloadRates& rates,
                                           int64_t device_bytes);

// Layers recomputed in a step with `checkpointed` checkpointed and `offloaded` offloaded (an
// offloaded checkpointed layer runs unrecomputed).
int64_t RecomputedLayers(int64_t layers, int64_t checkpointed, int64_t offloaded);

struct OffloadedPlan {
  ActivationPlan memory;              // its checkpointed_layers count the offloaded ones
  int64_t offloaded_layers = 0;
  int64_t offloadable_layers = 0;  // what the link and host memory allowed
  // ActivationPlanRequest::offloaded_inputs: -1 (every input of a checkpointed layer while any
  // layer is offloaded), or a count with no layer offloaded (the inputs alone).
  int64_t offloaded_inputs = -1;
};

// enable_gradient_checkpointing: auto with offload_activation_layers: auto. The memory plan for
// 0 up to OffloadableLayers offloaded layers: the one that recomputes the fewest layers, and at
// that the fewest offloaded. None when the budget fits without checkpointing (offloading would
// spare nothing). Offloading lowers the peak, so a budget too small for the plan alone can fit
// with it. Where no such plan fits (rows so long that the host cannot hold every checkpointed
// input beside a layer's saves), the inputs alone: the fewest offloaded that fit, within
// OffloadableInputs. The errors are PlanCheckpointing's without offloading.
absl::StatusOr<OffloadedPlan> PlanCheckpointingWithOffload(const ActivationPlanRequest& request,
                                                           const OffloadRates& rates);

// "host link 54.1 GB/s, GEMMs 702 TFLOP/s, 60.0 GiB of host memory for 27 layers: the link keeps
// up with 11 layers' copies".
std::string DescribeOffloadCapacity(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                                    const OffloadRates& rates);

// Which layers an offload of n takes, and where backward fetches each back.
struct OffloadPlacement {
  std::vector<bool> offloaded;  // per layer
  std::vector<bool> input_offloaded;  // per layer: a checkpointed layer whose input waits in host memory
  // Per layer: the layers whose offloaded tensors the hook on that layer's output fetches (it
  // runs before the layer's backward), the highest first: one copy stream serves them in order,
  // and backward reaches the highest first. (An offloaded layer's attention tensors come later,
  // once the layer above it has done its MLP backward: LlamaForCausalLM::OffloadLateGroup.)
  std::vector<std::vector<int64_t>> prefetch_at;
};

// The layers `n` offloaded layers take with the lowest `checkpointed` layers checkpointed
// (OffloadedLayerSet: never the top one, which backward needs first; spread evenly, so that each
// offloaded layer is followed by others whose forward hides its copy to the host and whose
// backward its copy back). Fetching back: an offloaded checkpointed layer's tensors at the
// layer two above (its backward recomputes, so two layers' backward cover its copy), a plain one's
// at the next offloaded layer above, else the top (a plain layer's backward lasts about a third of
// the copy of its tensors over the host link: the copy needs every layer between them), and a
// checkpointed layer's input (offloaded whenever offloading is on, but the top layer's) one layer
// above; never before the next offloaded layer above is fetched (at most two layers' tensors come
// back ahead). `inputs` (ActivationPlanRequest::offloaded_inputs): which checkpointed inputs
// travel, -1 every one while a layer is offloaded; a count takes the highest ones (the lowest
// are held on the device either way until the end of the step's backward).
OffloadPlacement PlaceOffloads(int64_t layers, int64_t checkpointed, int64_t n, int64_t inputs = -1);

}  // namespace qlora::memory
