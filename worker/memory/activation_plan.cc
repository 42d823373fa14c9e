// The step's memory model and the checkpointing choice (see activation_plan.h for the terms).
#include "worker/memory/activation_plan.h"

#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "worker/engine/aligned_rows.h"

namespace qlora::memory {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

bool Targets(const ActivationPlanRequest& r, const std::string& module) {
  return r.lora_r > 0 &&
         std::find(r.lora_targets.begin(), r.lora_targets.end(), module) != r.lora_targets.end();
}

// The modules that read one input (linear4bit.h SharedInputForward): a group node runs them
// where two or more are adapted and no dropout runs.
constexpr std::array<const char*, 3> kQkv = {"q_proj", "k_proj", "v_proj"};
constexpr std::array<const char*, 2> kGateUp = {"gate_proj", "up_proj"};

// How many of `group` have adapters.
template <size_t N>
int64_t Adapted(const ActivationPlanRequest& r, const std::array<const char*, N>& group) {
  return std::count_if(group.begin(), group.end(),
                       [&](const char* name) { return Targets(r, name); });
}

// Elements of the As that the group nodes read concatenated (q/k/v and gate/up, two or more
// adapted and no dropout), which AdapterCopies keeps once more.
int64_t GroupedAdapterElements(const ActivationPlanRequest& r) {
  if (r.lora_dropout) return 0;
  int64_t grouped = 0;
  for (const int64_t n : {Adapted(r, kQkv), Adapted(r, kGateUp)}) {
    if (n > 1) grouped += n;
  }
  return grouped * r.lora_r * r.model.hidden_size * r.model.num_hidden_layers;
}

// The plan's fixed part: built tensors, parameter gradients, the adapters' compute-dtype
// copies (adapter_copies.h, held through the step: every adapter, and the grouped As again),
// one dequantized weight.
int64_t FixedBytes(const ActivationPlanRequest& r) {
  const LlamaConfig& m = r.model;
  const int64_t largest_weight =
      std::max(m.intermediate_size * m.hidden_size,
               m.num_attention_heads * m.head_dim * m.hidden_size) * r.dtype_bytes;
  return r.built_bytes + r.correction_bytes + (4 + r.dtype_bytes) * r.trainable_elements +
         r.dtype_bytes * GroupedAdapterElements(r) + largest_weight + 2 * r.gathered_layer_bytes;
}

}  // namespace

int64_t OffloadedCheckpointedLayers(int64_t layers, int64_t checkpointed, int64_t offloaded) {
  return std::min(offloaded, std::min(checkpointed, layers - 1));
}

std::vector<bool> OffloadedLayerSet(int64_t layers, int64_t checkpointed, int64_t offloaded) {
  std::vector<bool> set(std::max<int64_t>(layers, 0), false);
  if (layers <= 1) return set;
  const int64_t c = std::clamp<int64_t>(checkpointed, 0, layers);
  const int64_t n = std::clamp<int64_t>(offloaded, 0, layers - 1);
  // Evenly over the checkpointed layers [0, c), the top layer excepted.
  const int64_t checkpointed_candidates = std::min(c, layers - 1);
  const int64_t from_checkpointed = std::min(n, checkpointed_candidates);
  for (int64_t k = 0; k < from_checkpointed; ++k) {
    set[(2 * k + 1) * checkpointed_candidates / (2 * from_checkpointed)] = true;
  }
  // Then evenly over the plain layers [c, layers - 1), from the lowest: the widest gap lies
  // between the top one and the top layer, where backward starts.
  const int64_t plain_candidates = std::max<int64_t>(layers - 1 - c, 0);
  const int64_t from_plain = std::min(n - from_checkpointed, plain_candidates);
  for (int64_t k = 0; k < from_plain; ++k) set[c + k * plain_candidates / from_plain] = true;
  return set;
}

bool OffloadedNeighbours(int64_t layers, int64_t checkpointed, int64_t offloaded) {
  const std::vector<bool> set = OffloadedLayerSet(layers, checkpointed, offloaded);
  for (size_t i = 0; i + 1 < set.size(); ++i) {
    if (set[i] && set[i + 1]) return true;
  }
  return false;
}

bool MoreRowsThanATile(const ActivationPlanRequest& r) {
  return r.micro_batch * r.sequence_length > kMlpTileRows;
}

int64_t UsableBytes(const ActivationPlanRequest& r, int64_t budget_bytes) {
  return static_cast<int64_t>(static_cast<double>(budget_bytes) * (1.0 - r.margin_fraction));
}

int64_t OffloadedInputCount(int64_t layers, int64_t checkpointed, int64_t offloaded, int64_t requested) {
  const int64_t c = std::clamp<int64_t>(checkpointed, 0, layers);
  const int64_t candidates =
      std::min(c, layers - 1) - OffloadedCheckpointedLayers(layers, c, std::max<int64_t>(offloaded, 0));
  if (candidates <= 0) return 0;
  if (requested < 0) return offloaded > 0 ? candidates : 0;
  return std::min(requested, candidates);
}

int64_t OffloadedInputs(const ActivationPlanRequest& r, int64_t checkpointed, int64_t offloaded) {
  return OffloadedInputCount(r.model.num_hidden_layers, checkpointed, offloaded, r.offloaded_inputs);
}

LayerActivationBytes PerTokenLayerBytes(const ActivationPlanRequest& r) {
  const LlamaConfig& m = r.model;
  const int64_t d = r.dtype_bytes, H = m.hidden_size, I = m.intermediate_size;
  const int64_t Q = m.num_attention_heads * m.head_dim, K = m.num_key_value_heads * m.head_dim;
  LayerActivationBytes b;
  b.checkpointed = H * d;
  int64_t plain = (H * d + 4)                          // input_layernorm: x, rstd
                  + (2 * Q + 2 * K) * d                // q, k, v, attention output
                  + 4 * m.num_attention_heads          // logsumexp
                  + (H * d + 4)                        // post_attention_layernorm: h, rstd
                  + 2 * I * d;                         // SwiGLU: gate, up
  struct Module {
    const char* name;
    int64_t in;
  };
  const Module modules[] = {{"q_proj", H},    {"k_proj", H},  {"v_proj", H},   {"o_proj", Q},
                            {"gate_proj", H}, {"up_proj", H}, {"down_proj", I}};
  bool reads_n = false, reads_m = false, saves_gated = false;
  for (const Module& module : modules) {
    if (!Targets(r, module.name)) continue;
    plain += r.lora_r * d;  // h A^T
    const std::string name = module.name;
    if (r.lora_dropout) {
      plain += module.in * (d + r.dropout_mask_bytes);  // the dropped input and its mask
    } else if (name == "q_proj" || name == "k_proj" || name == "v_proj") {
      reads_n = true;
    } else if (name == "gate_proj" || name == "up_proj") {
      reads_m = true;
    } else if (name == "down_proj") {
      saves_gated = true;
    }  // o_proj's input is the attention output, already counted
  }
  // Over the fused norms, a group node (two or more adapted) keeps its norm's source and rstd,
  // which the norm keeps anyway, instead of n or m (linear4bit.h NormedInput).
  const bool keeps_n = reads_n && !(r.fused_norms && Adapted(r, kQkv) > 1);
  const bool keeps_m = reads_m && !(r.fused_norms && Adapted(r, kGateUp) > 1);
  plain += (keeps_n ? H * d : 0) + (keeps_m ? H * d : 0);
  // gate and up packed (equally wide, both adapted): the rows keep the adapters' columns spare
  // for backward's low-rank term (lora_wide_group_function.cc PackedForward); q/k/v packed (multi-head), their
  // gradients may be packed likewise, replacing q's and k's rotated gradients (Q + K).
  const bool packable = reads_m && Adapted(r, kGateUp) == 2;
  plain += packable ? (engine::AlignedRow(2 * I + 2 * r.lora_r) - 2 * I) * d : 0;
  if (reads_n && Q == K && Adapted(r, kQkv) == 3) {
    b.packed_gradients = (engine::AlignedRow(Q + 2 * K + 3 * r.lora_r) - (Q + K)) * d;
  }
  // down_proj's input, silu(gate) * up: a plain layer's down node gets it again in backward
  // (SwigluThenForward); a checkpointed layer's recomputation saves it.
  b.plain = plain;
  b.recomputed = plain + (saves_gated ? I * d : 0) - b.checkpointed;
  const int64_t mlp_backward = (2 * H + 2 * I) * d;
  const int64_t attention_backward = (2 * H + 2 * Q + 2 * K) * d + 4 * Q;
  b.backward = std::max(mlp_backward, attention_backward);
  // Tiled: the MLP's saves (the post-attention norm's, gate and up, the adapters' h A^T, m or
  // the packed rows' spare columns, the SwiGLU output) go to the tile; the recomputation keeps
  // h = residual + o (the tiles' input) instead (the tiles' outputs join in the graph alone:
  // engine::CatGraphOnly), and the tiles' input gradients join into one before the attention's
  // backward.
  int64_t mlp = (H * d + 4) + 2 * I * d + (keeps_m ? H * d : 0) +
                (packable ? (engine::AlignedRow(2 * I + 2 * r.lora_r) - 2 * I) * d : 0) +
                (saves_gated ? I * d : 0);
  for (const Module& module : modules) {
    const std::string name = module.name;
    if (!Targets(r, module.name) || (name != "gate_proj" && name != "up_proj" && name != "down_proj")) {
      continue;
    }
    mlp += r.lora_r * d + (r.lora_dropout ? module.in * (d + r.dropout_mask_bytes) : 0);
  }
  b.recomputed_tiled = b.recomputed - mlp + H * d;
  b.backward_tiled = std::max(attention_backward, 2 * H * d);
  b.tile_row = mlp + mlp_backward;
  return b;
}

int64_t PlannedPeakBytes(const ActivationPlanRequest& r, int64_t checkpointed_layers) {
  const LlamaConfig& m = r.model;
  const int64_t layers = m.num_hidden_layers;
  const int64_t c = std::clamp<int64_t>(checkpointed_layers, 0, layers), plain = layers - c;
  const int64_t tokens = r.micro_batch * r.sequence_length;
  const int64_t d = r.dtype_bytes, H = m.hidden_size;
  const LayerActivationBytes per = PerTokenLayerBytes(r);
  const int64_t backward = per.backward + (c == 0 ? per.packed_gradients : 0);
  // A checkpointed layer's recomputation and backward, its MLP whole or in tiles (one at a time).
  const bool tiled = r.mlp_tile_rows > 0 && tokens > r.mlp_tile_rows;
  const int64_t recomputed = tiled ? per.recomputed_tiled : per.recomputed;
  const int64_t recomputed_backward = tiled ? per.backward_tiled : backward;
  const int64_t tile = tiled ? r.mlp_tile_rows * per.tile_row : 0;
  const int64_t around = 3 * H * d + 4 + 2 * m.head_dim * d;  // final norm, loss copy, rotary
  // Offloaded layers, checkpointed ones first (the top layer never): on the device only while
  // in transit, one layer's worth in forward (two where offloaded layers are neighbours), two in
  // backward.
  const int64_t offloaded_checkpointed = OffloadedCheckpointedLayers(layers, c, r.offloaded_layers);
  const int64_t offloaded_plain =
      std::min(r.offloaded_layers - offloaded_checkpointed, std::max<int64_t>(plain - 1, 0));
  int64_t in_transit = 0;
  if (offloaded_checkpointed + offloaded_plain > 0) {
    in_transit = OffloadedNeighbours(layers, c, r.offloaded_layers) ? 2 * per.plain : per.plain;
  }
  // Checkpointed inputs held on the device: all, or with offloaded ones those kept and two more
  // (the top layer's, those in transit).
  const int64_t offloaded_inputs = OffloadedInputs(r, c, r.offloaded_layers);
  const int64_t kept_inputs =
      std::max<int64_t>(std::min(c, layers - 1) - offloaded_checkpointed - offloaded_inputs, 0);
  const int64_t inputs = std::min(c - offloaded_checkpointed,
                                  offloaded_inputs > 0 ? kept_inputs + 2 : c);
  const int64_t held =
      tokens * (inputs * per.checkpointed + (plain - offloaded_plain) * per.plain + around +
                in_transit);
  const int64_t chunk = std::min(r.loss_chunk, tokens);
  const int64_t loss = tokens * H * d + chunk * m.vocab_size * d;  // grad_hidden, one chunk
  // A checkpointed layer's recomputation saves what a plain one does, its input aside (the
  // checkpoint holds that already, and the recomputation saves the same storage).
  // The top layer's backward: a plain layer's gradients, or a checkpointed layer recomputed.
  const int64_t top_layer = plain == 0 ? tokens * (recomputed_backward + recomputed) + tile
                                       : tokens * backward;
  // Plain layers' gathered weights, kept by their graphs until their backward.
  int64_t peak = held + plain * r.gathered_layer_bytes + std::max(loss, top_layer);
  if (c > 0 && plain > 0) {  // the top checkpointed layer, the plain ones freed by then
    peak = std::max(peak, tokens * (inputs * per.checkpointed + recomputed + recomputed_backward +
                                    around) + tile);
  }
  if (in_transit > 0) {  // an offloaded layer's backward, the next one's tensors arriving
    peak = std::max(peak, tokens * (inputs * per.checkpointed + 2 * per.plain + backward + around));
  }
  return FixedBytes(r) + peak;
}

int64_t LeanestCheckpointedLayers(const ActivationPlanRequest& r) {
  const int64_t layers = r.model.num_hidden_layers;
  if (layers > 1 && PlannedPeakBytes(r, layers - 1) <= PlannedPeakBytes(r, layers)) return layers - 1;
  return layers;
}

int64_t MlpTileRowsFor(const ActivationPlanRequest& request, int64_t checkpointed,
                       int64_t device_bytes) {
  ActivationPlanRequest r = request;
  r.mlp_tile_rows = 0;
  const bool fits = PlannedPeakBytes(r, checkpointed) <= UsableBytes(r, device_bytes);
  return !fits && MoreRowsThanATile(r) ? kMlpTileRows : 0;
}

absl::StatusOr<ActivationPlan> PlanCheckpointing(const ActivationPlanRequest& r) {
  if (r.budget_bytes <= 0) {
    return absl::InvalidArgumentError("trainer.max_memory_gib: the memory budget must be > 0");
  }
  if (r.model.num_hidden_layers < 1 || r.micro_batch < 1 || r.sequence_length < 1) {
    return absl::InvalidArgumentError(
        "memory plan: the model needs layers and the micro-batch tokens");
  }
  const int64_t layers = r.model.num_hidden_layers;
  const int64_t usable = UsableBytes(r, r.budget_bytes);
  const int64_t leanest = LeanestCheckpointedLayers(r);
  const int64_t minimum = PlannedPeakBytes(r, leanest);
  if (minimum > usable && r.mlp_tile_rows == 0 && MoreRowsThanATile(r)) {
    ActivationPlanRequest tiled = r;
    tiled.mlp_tile_rows = kMlpTileRows;
    const absl::StatusOr<ActivationPlan> plan = PlanCheckpointing(tiled);
    if (plan.ok()) return plan;
  }
  if (minimum > usable) {
    const int64_t needed =
        static_cast<int64_t>(static_cast<double>(minimum) / (1.0 - r.margin_fraction)) + 1;
    return absl::FailedPreconditionError(absl::StrFormat(
        "trainer.max_memory_gib: a budget of %s is below what this step needs with (nearly) every "
        "decoder layer checkpointed: a planned peak of %s, %s with the %.0f%% margin; raise "
        "max_memory_gib to at least %.1f, or lower trainer.batch_size (%d) or "
        "data.max_sequence_length (%d)",
        FormatMemory(r.budget_bytes), FormatMemory(minimum), FormatMemory(needed),
        100 * r.margin_fraction, static_cast<double>(needed) / kGiB + 0.05, r.micro_batch,
        r.sequence_length));
  }
  // Below the leanest split the peak grows with every plain layer; find the fewest checkpointed
  // that fit.
  int64_t checkpointed = leanest;
  while (checkpointed > 0 && PlannedPeakBytes(r, checkpointed - 1) <= usable) --checkpointed;
  ActivationPlan plan;
  plan.checkpointed_layers = checkpointed;
  plan.mlp_tile_rows = r.mlp_tile_rows;
  plan.layers = layers;
  plan.planned_peak_bytes = PlannedPeakBytes(r, checkpointed);
  plan.budget_bytes = r.budget_bytes;
  return plan;
}

std::string FormatMemory(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= kGiB) return absl::StrFormat("%.1f GiB", b / kGiB);
  return absl::StrFormat("%.1f MiB", b / (1024.0 * 1024.0));
}

std::string DescribePlan(const ActivationPlan& plan) {
  return absl::StrFormat(
      "activation checkpointing: %d of %d layers checkpointed%s, planned peak %s of a %s budget",
      plan.checkpointed_layers, plan.layers,
      plan.mlp_tile_rows > 0
          ? absl::StrFormat(" (their MLPs in tiles of %d rows)", plan.mlp_tile_rows)
          : "",
      FormatMemory(plan.planned_peak_bytes), FormatMemory(plan.budget_bytes));
}

}  // namespace qlora::memory
