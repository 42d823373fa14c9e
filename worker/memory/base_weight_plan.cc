// Where a job's frozen base weights live (see base_weight_plan.h).
#include "worker/memory/base_weight_plan.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/memory/activation_offload_plan.h"

namespace qlora::memory {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one projection's frozen weight of `elements` in the loader's layout: the codes (two
// a byte), the block scales (one byte each under double quantization, with a float32 scale per
// 256 blocks and the 256-entry code, else float32 each), each segment aligned as layer_bytes.h
// aligns it.
int64_t ProjectionBytes(int64_t elements, const QuantizationConfig& q, int64_t dtype_bytes) {
  constexpr int64_t kAlignment = 256, kNestedBlock = 256;
  const auto aligned = [](int64_t n) { return CeilDiv(n, kAlignment) * kAlignment; };
  if (!q.enabled) return aligned(elements * dtype_bytes);
  const int64_t blocks = CeilDiv(elements, q.blocksize);
  const int64_t scales = q.double_quant ? aligned(blocks) + aligned(4 * CeilDiv(blocks, kNestedBlock)) +
                                              aligned(4 * 256)
                                        : aligned(4 * blocks);
  return aligned(CeilDiv(elements, 2)) + scales;
}

// The trainable elements of the adapters: r x (in + out) for every targeted projection.
int64_t AdapterElements(const LlamaConfig& model, int64_t r,
                        const std::vector<std::string>& targets) {
  int64_t per_layer = 0;
  for (const std::string& name : targets) {
    const LlamaConfig::Features f = model.ProjectionFeatures(name);
    per_layer += r * (f.in + f.out);
  }
  return per_layer * model.num_hidden_layers;
}

}  // namespace

const char* PlacementName(BaseWeightPlacement placement) {
  switch (placement) {
    case BaseWeightPlacement::kOnDevice: return "on device";
    case BaseWeightPlacement::kSharded: return "sharded";
    case BaseWeightPlacement::kStreamed: return "streamed from host memory";
  }
  return "?";
}

BaseWeightBytes FrozenWeightBytes(const LlamaConfig& model, const QuantizationConfig& quantization,
                                  int64_t dtype_bytes, bool input_embedding_on_host) {
  BaseWeightBytes b;
  for (const char* name : kProjectionNames) {
    const LlamaConfig::Features f = model.ProjectionFeatures(name);
    b.per_layer += ProjectionBytes(f.in * f.out, quantization, dtype_bytes);
  }
  const int64_t H = model.hidden_size;
  const int64_t embeddings = model.vocab_size * H * dtype_bytes;
  // Embeddings and lm_head (once when tied) stay in the compute dtype; so do the norms. An untied
  // input table may wait in host memory.
  const int64_t tables =
      model.tie_word_embeddings ? 1 : (input_embedding_on_host ? 1 : 2);
  b.outside = embeddings * tables +
              (2 * model.num_hidden_layers + 1) * H * dtype_bytes;
  return b;
}

ActivationPlanRequest ActivationRequestFor(const JobConfig& job, const LlamaConfig& model,
                                           bool cuda) {
  ActivationPlanRequest r;
  r.model = model;
  r.micro_batch = RowsPerMicroBatch(job);
  r.sequence_length = job.data.max_sequence_length;
  r.dtype_bytes = job.quantization.compute_dtype == ComputeDtype::kFloat32 ? 4 : 2;
  r.lora_r = job.lora.r;
  r.lora_targets = job.lora.target_modules;
  r.lora_dropout = job.lora.dropout > 0;
  // CUDA's dropout keeps a bool mask; the CPU's keeps the scaled mask in the input's dtype.
  r.dropout_mask_bytes = cuda ? 1 : r.dtype_bytes;
  // On CUDA the norms are fused nodes, whose sources the grouped nodes keep (activation_plan.h).
  r.fused_norms = cuda;
  r.trainable_elements = AdapterElements(model, r.lora_r, r.lora_targets);
  return r;
}

PlacementPeak PlannedPeakOf(const BaseWeightPlanRequest& request, BaseWeightPlacement placement) {
  ActivationPlanRequest r = request.activations;
  const int64_t layers = r.model.num_hidden_layers;
  const int64_t world = std::max(request.world_size, 1);
  const BaseWeightBytes weights = FrozenWeightBytes(r.model, request.quantization, r.dtype_bytes,
                                                    request.input_embedding_on_host);
  int64_t on_device = weights.total(layers);
  r.gathered_layer_bytes = 0;
  if (placement == BaseWeightPlacement::kSharded) {
    on_device = weights.outside + CeilDiv(weights.per_layer, world) * layers;
    r.gathered_layer_bytes = weights.per_layer;
  } else if (placement == BaseWeightPlacement::kStreamed) {
    on_device = weights.outside;
    r.gathered_layer_bytes = weights.per_layer;
  }
  PlacementPeak p;
  p.device_weight_bytes = on_device;
  // The adapters (float32) and the strategy's float32 master copy and AdamW moments (unless in
  // host memory), the last two partitioned across ranks from stage 1 up; the gradients and
  // compute-dtype copies are the activation plan's.
  const int64_t strategy_bytes_per_element = request.adamw_moments_on_host ? 4 : 12;
  r.built_bytes = on_device + 4 * r.trainable_elements +
                  CeilDiv(strategy_bytes_per_element * r.trainable_elements, world);
  int64_t checkpointed = LeanestCheckpointedLayers(r);
  p.peak_bytes = PlannedPeakBytes(r, checkpointed);
  // Past the budget the activation plan tiles the checkpointed layers' MLPs, then offloads
  // their inputs (activation_plan.h, activation_offload_plan.h): count them as it would.
  const int64_t usable = request.budget_bytes > 0 ? UsableBytes(r, request.budget_bytes) : 0;
  if (usable <= 0) return p;
  if (request.mlp_tiles) r.mlp_tile_rows = MlpTileRowsFor(r, checkpointed, request.budget_bytes);
  if (r.mlp_tile_rows > 0) {
    checkpointed = LeanestCheckpointedLayers(r);
    p.peak_bytes = PlannedPeakBytes(r, checkpointed);
    p.mlp_tile_rows = r.mlp_tile_rows;
  }
  // The fewest inputs that fit (as InputsAmongCheckpointed), else as many as the host holds.
  if (p.peak_bytes > usable) {
    p.offloaded_inputs = FewestInputsThatFit(
        r, checkpointed, InputsTheHostHolds(r, checkpointed, request.activation_host_bytes),
        request.budget_bytes);
    if (p.offloaded_inputs > 0) {
      r.offloaded_inputs = p.offloaded_inputs;
      p.peak_bytes = PlannedPeakBytes(r, checkpointed);
    }
  }
  return p;
}

int64_t PlannedPeakWith(const BaseWeightPlanRequest& request, BaseWeightPlacement placement,
                        int64_t* device_weight_bytes) {
  const PlacementPeak p = PlannedPeakOf(request, placement);
  if (device_weight_bytes != nullptr) *device_weight_bytes = p.device_weight_bytes;
  return p.peak_bytes;
}

BaseWeightPlan PlanBaseWeights(const BaseWeightPlanRequest& request) {
  BaseWeightPlan plan;
  plan.budget_bytes = request.budget_bytes;
  if (request.budget_bytes <= 0) {
    plan.reason =
        "stage 2, base weights on device: no memory budget to plan for (no "
        "trainer.max_memory_gib and no GPU)";
    return plan;
  }
  const int64_t usable = UsableBytes(request.activations, request.budget_bytes);
  struct Option {
    BaseWeightPlacement placement;
    int stage;
    bool offload_param;
  };
  std::vector<Option> options = {{BaseWeightPlacement::kOnDevice, 2, false}};
  if (request.world_size > 1) options.push_back({BaseWeightPlacement::kSharded, 3, false});
  options.push_back({BaseWeightPlacement::kStreamed, 3, true});
  std::string passed;  // what the placements before the chosen one would need
  for (size_t i = 0; i < options.size(); ++i) {
    const Option& o = options[i];
    const PlacementPeak p = PlannedPeakOf(request, o.placement);
    const int64_t peak = p.peak_bytes;
    const bool last = i + 1 == options.size();
    if (peak <= usable || last) {
      plan.zero_stage = o.stage;
      plan.offload_param = o.offload_param;
      plan.placement = o.placement;
      plan.device_weight_bytes = p.device_weight_bytes;
      plan.planned_peak_bytes = peak;
      plan.mlp_tile_rows = p.mlp_tile_rows;
      plan.offloaded_inputs = p.offloaded_inputs;
      const std::string where =
          o.placement == BaseWeightPlacement::kSharded
              ? absl::StrFormat("base weights sharded across %d ranks", request.world_size)
              : absl::StrCat("base weights ", PlacementName(o.placement));
      std::string activations = "every layer checkpointed";
      if (p.mlp_tile_rows > 0) {
        absl::StrAppend(&activations, ", their MLPs in tiles of ", p.mlp_tile_rows, " rows");
      }
      if (p.offloaded_inputs > 0) {
        absl::StrAppend(&activations, p.mlp_tile_rows > 0 ? " and " : ", ", p.offloaded_inputs,
                        " of their inputs in host memory");
      }
      plan.reason = absl::StrFormat(
          "stage %d, %s: planned peak %s of a %s budget with %s%s%s", o.stage, where,
          FormatMemory(peak), FormatMemory(request.budget_bytes), activations,
          passed.empty() ? "" : absl::StrCat(" (", passed, ")"),
          peak <= usable ? "" : "; over the budget less its margin even so");
      return plan;
    }
    absl::StrAppend(&passed, passed.empty() ? "" : "; ", PlacementName(o.placement), " would need ",
                    FormatMemory(peak));
  }
  return plan;
}

}  // namespace qlora::memory
