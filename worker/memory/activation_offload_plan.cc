// The host link's time model behind offload_activation_layers: auto (see activation_offload_plan.h).
#include "worker/memory/activation_offload_plan.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_format.h"
#include "worker/memory/pinned_block_bytes.h"

namespace qlora::memory {
namespace {

int64_t Tokens(const ActivationPlanRequest& r) { return r.micro_batch * r.sequence_length; }

// The bytes a step sends to host memory with `c` checkpointed and `n` offloaded layers (placed
// as LlamaForCausalLM::SetOffloadedLayers does: checkpointed ones first, never the top layer):
// an offloaded layer's saved tensors, the offloaded inputs of the other checkpointed layers.
double OffloadedBytes(const ActivationPlanRequest& r, int64_t c, int64_t n) {
  const LayerActivationBytes per = PerTokenLayerBytes(r);
  const int64_t inputs = OffloadedInputs(r, c, n);
  return static_cast<double>(Tokens(r)) *
         static_cast<double>(n * per.plain + inputs * per.checkpointed);
}

// The forward's time: its FLOPs at the GEMM rate over the GEMMs' share.
double ForwardSeconds(const ActivationPlanRequest& r, const OffloadRates& rates) {
  return static_cast<double>(r.model.num_hidden_layers) * static_cast<double>(Tokens(r)) *
         LayerForwardFlopsPerToken(r) / (rates.gemm_flops_per_s * kGemmShareOfForward);
}

// Whether the copies of `n` offloaded layers (with `c` checkpointed) keep up with the step: the
// out, backlog and back windows of activation_offload_plan.h.
bool CopiesFit(const ActivationPlanRequest& r, int64_t c, int64_t n, const OffloadRates& rates) {
  const int64_t layers = r.model.num_hidden_layers;
  const double forward = ForwardSeconds(r, rates) / static_cast<double>(layers);
  const double backward = kBackwardOverForward * forward;
  const int64_t region = std::max(std::min(c, layers - 1), std::min(n, layers - 1));
  const int64_t above = layers - region;
  const double bytes = OffloadedBytes(r, c, n), link = rates.host_link_bytes_per_s;
  const double out = static_cast<double>(layers) * forward + static_cast<double>(above) * backward;
  const double backlog = bytes - link * static_cast<double>(region) * forward;
  const double back = static_cast<double>(region + std::min<int64_t>(above, 2)) * backward +
                      static_cast<double>(RecomputedLayers(layers, c, n)) * forward;
  return bytes <= link * std::min(out, back) &&
         backlog <= static_cast<double>(rates.max_pending_bytes);
}

// The most layers, below the top one, for which `fits(n)` holds for every n up to them (0 when
// not even one layer fits).
template <typename Fits>
int64_t MostLayers(const ActivationPlanRequest& r, Fits fits) {
  int64_t n = 0;
  while (n + 1 < r.model.num_hidden_layers && fits(n + 1)) ++n;
  return n;
}

// The most layers whose copies keep up.
int64_t LayersByLink(const ActivationPlanRequest& r, int64_t checkpointed_layers,
                     const OffloadRates& rates) {
  return MostLayers(r, [&](int64_t n) { return CopiesFit(r, checkpointed_layers, n, rates); });
}

// Whether the host memory holds the pinned copies, each block counted as the most it may take
// (pinned_block_bytes.h).
bool HostHolds(const ActivationPlanRequest& r, int64_t c, int64_t n, const OffloadRates& rates) {
  return kPinnedBlockOverhead * OffloadedBytes(r, c, n) <= static_cast<double>(rates.host_bytes);
}

// The most layers whose pinned copies the host memory holds.
int64_t LayersByHostMemory(const ActivationPlanRequest& r, int64_t checkpointed_layers,
                           const OffloadRates& rates) {
  return MostLayers(r, [&](int64_t n) { return HostHolds(r, checkpointed_layers, n, rates); });
}

// The most checkpointed layers' inputs (no layer offloaded) that the host holds and, with
// `link`, whose copies keep up.
int64_t MostInputs(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                   const OffloadRates& rates, bool link) {
  ActivationPlanRequest r = request;
  r.offloaded_layers = 0;
  return MostLayers(r, [&](int64_t k) {
    r.offloaded_inputs = k;
    return OffloadedInputs(r, checkpointed_layers, 0) == k &&  // there are k to offload
           HostHolds(r, checkpointed_layers, 0, rates) &&
           (!link || CopiesFit(r, checkpointed_layers, 0, rates));
  });
}

}  // namespace

double LayerForwardFlopsPerToken(const ActivationPlanRequest& r) {
  const LlamaConfig& m = r.model;
  const double H = static_cast<double>(m.hidden_size), I = static_cast<double>(m.intermediate_size);
  const double Q = static_cast<double>(m.num_attention_heads * m.head_dim);
  const double K = static_cast<double>(m.num_key_value_heads * m.head_dim);
  const double projections = H * (Q + 2 * K) + Q * H + 3 * H * I;
  // q k^T and p v over the (s + 1) / 2 positions a causal row sees on average.
  const double attention = 2.0 * Q * (static_cast<double>(r.sequence_length) + 1.0);
  return 2.0 * projections + attention;
}

int64_t RecomputedLayers(int64_t layers, int64_t checkpointed, int64_t offloaded) {
  return checkpointed - OffloadedCheckpointedLayers(layers, checkpointed, offloaded);
}

int64_t OffloadableLayers(const ActivationPlanRequest& r, int64_t checkpointed_layers,
                          const OffloadRates& rates) {
  if (rates.host_link_bytes_per_s <= 0 || rates.gemm_flops_per_s <= 0 || Tokens(r) <= 0) return 0;
  return std::min(LayersByLink(r, checkpointed_layers, rates),
                  LayersByHostMemory(r, checkpointed_layers, rates));
}

int64_t OffloadableInputs(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                          const OffloadRates& rates) {
  if (rates.host_link_bytes_per_s <= 0 || rates.gemm_flops_per_s <= 0 || Tokens(request) <= 0) {
    return 0;
  }
  return MostInputs(request, checkpointed_layers, rates, /*link=*/true);
}

int64_t InputsTheHostHolds(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                           int64_t host_bytes) {
  if (host_bytes <= 0 || Tokens(request) <= 0) return 0;
  OffloadRates host;
  host.host_bytes = host_bytes;
  return MostInputs(request, checkpointed_layers, host, /*link=*/false);
}

int64_t FewestInputsThatFit(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                            int64_t most, int64_t device_bytes) {
  ActivationPlanRequest r = request;
  r.offloaded_layers = 0;
  r.offloaded_inputs = 0;
  const int64_t usable = UsableBytes(r, device_bytes);
  if (PlannedPeakBytes(r, checkpointed_layers) <= usable) return 0;
  for (int64_t k = 1; k < most; ++k) {
    r.offloaded_inputs = k;
    if (PlannedPeakBytes(r, checkpointed_layers) <= usable) return k;
  }
  return most;
}

int64_t InputsAmongCheckpointed(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                                const OffloadRates& rates, int64_t device_bytes) {
  return FewestInputsThatFit(request, checkpointed_layers,
                             OffloadableInputs(request, checkpointed_layers, rates), device_bytes);
}

CheckpointedOffload OffloadForCheckpointed(const ActivationPlanRequest& request,
                                           int64_t checkpointed_layers, const OffloadRates& rates,
                                           int64_t device_bytes) {
  const int64_t c = checkpointed_layers;
  ActivationPlanRequest r = request;
  r.offloaded_inputs = -1;
  r.offloaded_layers = OffloadAmongCheckpointed(r, c, rates, device_bytes);
  const CheckpointedOffload layers{r.offloaded_layers, -1};
  const int64_t layers_peak = PlannedPeakBytes(r, c);
  if (layers.layers > 0 && layers_peak <= UsableBytes(r, device_bytes)) return layers;
  r.offloaded_layers = 0;
  r.offloaded_inputs = InputsAmongCheckpointed(r, c, rates, device_bytes);
  if (layers.layers > 0 && PlannedPeakBytes(r, c) >= layers_peak) return layers;
  return CheckpointedOffload{0, r.offloaded_inputs};
}

absl::StatusOr<OffloadedPlan> PlanCheckpointingWithOffload(const ActivationPlanRequest& request,
                                                           const OffloadRates& rates) {
  ActivationPlanRequest r = request;
  r.offloaded_layers = 0;
  r.offloaded_inputs = -1;  // chosen here
  const absl::StatusOr<ActivationPlan> alone = PlanCheckpointing(r);
  if (alone.ok() && alone->checkpointed_layers == 0) return OffloadedPlan{*alone, 0, 0};
  const int64_t layers = r.model.num_hidden_layers;
  std::optional<OffloadedPlan> best;
  if (alone.ok()) best = OffloadedPlan{*alone, 0, 0};
  for (int64_t n = 1; n < layers; ++n) {
    r.offloaded_layers = n;
    const absl::StatusOr<ActivationPlan> plan = PlanCheckpointing(r);
    if (!plan.ok() || n > OffloadableLayers(r, plan->checkpointed_layers, rates)) continue;
    if (!best || RecomputedLayers(layers, plan->checkpointed_layers, n) <
                     RecomputedLayers(layers, best->memory.checkpointed_layers,
                                      best->offloaded_layers)) {
      best = OffloadedPlan{*plan, n, 0};
    }
  }
  if (!best) {
    // No plan fits with whole layers offloaded or none: the checkpointed layers' inputs alone,
    // the fewest that fit (each one less on the device), as many as the host holds at most.
    r.offloaded_layers = 0;
    for (int64_t k = 1; k < layers; ++k) {
      r.offloaded_inputs = k;
      const absl::StatusOr<ActivationPlan> plan = PlanCheckpointing(r);
      if (!plan.ok()) continue;
      if (k > OffloadableInputs(r, plan->checkpointed_layers, rates)) break;
      best = OffloadedPlan{*plan, 0, 0, k};
      break;
    }
    if (!best) return alone.status();
    return *best;
  }
  best->offloadable_layers = OffloadableLayers(r, best->memory.checkpointed_layers, rates);
  return *best;
}

int64_t OffloadAmongCheckpointed(const ActivationPlanRequest& request, int64_t checkpointed_layers,
                                 const OffloadRates& rates, int64_t device_bytes) {
  ActivationPlanRequest r = request;
  const int64_t c = checkpointed_layers, layers = r.model.num_hidden_layers;
  r.offloaded_layers = 0;
  const int64_t alone = PlannedPeakBytes(r, c);
  const int64_t usable = UsableBytes(r, device_bytes);
  // The most that fit the budget; where none does, those with the lowest peak (the most of
  // them), if it is below the peak without offloading.
  int64_t lowest = 0, lowest_peak = alone;
  for (int64_t n = OffloadedCheckpointedLayers(layers, c, OffloadableLayers(r, c, rates)); n > 0;
       --n) {
    r.offloaded_layers = n;
    const int64_t peak = PlannedPeakBytes(r, c);
    if (peak <= usable) return n;
    if (peak < lowest_peak || (lowest == 0 && peak == alone)) {
      lowest = n;
      lowest_peak = peak;
    }
  }
  return lowest;
}

std::string DescribeOffloadCapacity(const ActivationPlanRequest& r, int64_t checkpointed_layers,
                                    const OffloadRates& rates) {
  return absl::StrFormat(
      "host link %.1f GB/s, GEMMs %.0f TFLOP/s, %s of host memory for %d layers: the link keeps "
      "up with %d layers' copies",
      rates.host_link_bytes_per_s / 1e9, rates.gemm_flops_per_s / 1e12, FormatMemory(rates.host_bytes),
      LayersByHostMemory(r, checkpointed_layers, rates), LayersByLink(r, checkpointed_layers, rates));
}

OffloadPlacement PlaceOffloads(int64_t layers, int64_t checkpointed, int64_t n, int64_t inputs) {
  OffloadPlacement p;
  p.offloaded.assign(std::max<int64_t>(layers, 0), false);
  p.input_offloaded.assign(p.offloaded.size(), false);
  p.prefetch_at.assign(p.offloaded.size(), {});
  if (layers <= 1) return p;
  const int64_t c = std::clamp<int64_t>(checkpointed, 0, layers);
  n = std::clamp<int64_t>(n, 0, layers - 1);
  const int64_t input_count = OffloadedInputCount(layers, c, n, inputs);
  if (n == 0 && input_count == 0) return p;
  p.offloaded = OffloadedLayerSet(layers, c, n);
  // The inputs: the highest checkpointed layers below the top one that are not offloaded.
  for (int64_t j = std::min(c, layers - 1) - 1, left = input_count; j >= 0 && left > 0; --j) {
    if (!p.offloaded[j]) {
      p.input_offloaded[j] = true;
      --left;
    }
  }
  for (int64_t j = 0; j + 1 < layers; ++j) {
    int64_t at = j + 1;
    if (p.offloaded[j]) {
      at = j < c ? std::min(j + 2, layers - 1) : layers - 1;
      for (int64_t i = j + 1; i < at; ++i) {
        if (p.offloaded[i]) {
          at = i;
          break;
        }
      }
    } else if (!p.input_offloaded[j]) {
      continue;  // a plain layer, or a checkpointed one whose input stays: nothing to fetch
    }
    p.prefetch_at[at].push_back(j);
  }
  for (std::vector<int64_t>& groups : p.prefetch_at) std::sort(groups.rbegin(), groups.rend());
  return p;
}

}  // namespace qlora::memory
