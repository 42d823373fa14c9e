// One rank's activation-checkpointing split and its correction (see checkpointing_budget.h).
#include "worker/memory/checkpointing_budget.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <c10/core/ScalarType.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/base_weight_store.h"
#include "worker/memory/base_weight_plan.h"
#include "worker/memory/memory_budget.h"

namespace qlora::memory {
namespace {

// trainer.offload_activation_layers on a GPU (a CPU model's memory is host memory already).
int64_t OffloadedLayers(const CheckpointingBudgetOptions& o) {
  return o.device.is_cuda() ? o.config->trainer.offload_activation_layers : 0;
}

memory::ActivationPlanRequest RequestFor(const CheckpointingBudgetOptions& o) {
  const engine::LlamaForCausalLM& model = *o.model;
  // The job's request (as the base-weight plan makes it before loading), then what the built
  // model says: its compute dtype and the modules that got adapters.
  memory::ActivationPlanRequest r =
      ActivationRequestFor(*o.config, model.config(), o.device.is_cuda());
  r.dtype_bytes = static_cast<int64_t>(c10::elementSize(model.compute_dtype()));
  r.lora_r = 0;
  r.lora_targets.clear();
  r.lora_dropout = false;
  if (model.has_lora()) {
    const engine::LoraOptions& lora = model.lora_options();
    r.lora_r = lora.r;
    // The modules that got adapters (AddLora matched target_modules) in any layer.
    for (const char* name : engine::kLinearModuleNames) {
      const bool adapted = std::any_of(
          model.layers.begin(), model.layers.end(),
          [&](const engine::DecoderLayer& layer) { return layer.Linear(name).lora.has_value(); });
      if (adapted) r.lora_targets.emplace_back(name);
    }
    r.lora_dropout = lora.dropout > 0;
  }
  r.dropout_mask_bytes = o.device.is_cuda() ? 1 : r.dtype_bytes;  // in the model's dtype on a CPU
  r.trainable_elements = o.trainable_elements;
  r.built_bytes =
      o.allocated_bytes > 0 ? o.allocated_bytes : model.BuiltBytes() + o.strategy_bytes;
  r.offloaded_layers = OffloadedLayers(o);
  if (const engine::BaseWeightStore* store = model.base_weight_store()) {
    r.gathered_layer_bytes = store->largest_layer_bytes();
  }
  return r;
}

}  // namespace

bool CheckpointingBudget::UsesOffloadRates(const TrainerConfig& t, const c10::Device& device) {
  return t.offload_activation_auto && device.is_cuda() &&
         t.gradient_checkpointing != CheckpointingMode::kNone;
}

bool CheckpointingBudget::MayTileMlps(const TrainerConfig& t, const c10::Device& device) {
  return t.gradient_checkpointing == CheckpointingMode::kAuto ||
         (t.gradient_checkpointing == CheckpointingMode::kAll && device.is_cuda());
}

absl::StatusOr<CheckpointingBudget> CheckpointingBudget::Start(const CheckpointingBudgetOptions& o) {
  CheckpointingBudget b;
  b.model_ = o.model;
  b.request_ = RequestFor(o);  // the plan's figures, whatever the split (OffloadedLayerBytes)
  const TrainerConfig& t = o.config->trainer;
  b.offload_requested_ = t.offload_activation_layers;
  b.offload_auto_ = t.offload_activation_auto;
  b.automatic_ = t.gradient_checkpointing == CheckpointingMode::kAuto;
  if (UsesOffloadRates(t, o.device)) {
    // Offloading only speeds a step up: without the rates the job goes on without it.
    const absl::StatusOr<memory::OffloadRates> rates =
        o.offload_rates.value_or(absl::UnavailableError("no measurement was made"));
    if (rates.ok()) {
      b.offload_rates_ = *rates;
    } else {
      b.offload_unmeasured_ = std::string(rates.status().message());
    }
  }
  // Explicit counts are placed among whatever split follows; auto's choice once the split is known.
  o.model->SetOffloadedLayers(OffloadedLayers(o));
  if (!b.automatic_) {
    o.model->SetGradientCheckpointing(t.gradient_checkpointing == CheckpointingMode::kAll);
    if (t.gradient_checkpointing == CheckpointingMode::kAll) {
      // Every layer, or all but the top one when the plan shows that costs no memory (same
      // values either way, one layer's recomputation less).
      int64_t c = memory::LeanestCheckpointedLayers(b.request_);
      // max_memory_gib caps the allocator, so it is the room.
      const int64_t room = MemoryBudgetBytes(t, o.available_bytes);
      // Tiles where whole MLPs overrun the room (the longest rows).
      if (room > 0 && MayTileMlps(t, o.device)) {
        b.request_.mlp_tile_rows = memory::MlpTileRowsFor(b.request_, c, room);
        c = memory::LeanestCheckpointedLayers(b.request_);
        o.model->SetMlpTileRows(b.request_.mlp_tile_rows);
      }
      o.model->SetCheckpointedLayers(c);
      if (b.offload_rates_) {  // as many of the checkpointed layers as the link carries
        // ... and the budget holds, or the inputs alone where the device cannot hold them all
        // (the longest rows).
        const memory::CheckpointedOffload choice =
            memory::OffloadForCheckpointed(b.request_, c, *b.offload_rates_, room);
        o.model->SetOffloadedLayers(choice.layers, {}, choice.inputs);
      }
    }
    return b;
  }
  const int64_t budget = MemoryBudgetBytes(t, o.available_bytes);
  if (budget <= 0) {  // a CPU without max_memory_gib
    o.model->SetGradientCheckpointing(true);
    return b;
  }
  b.request_.budget_bytes = budget;
  if (b.offload_rates_) {
    absl::StatusOr<memory::OffloadedPlan> plan =
        memory::PlanCheckpointingWithOffload(b.request_, *b.offload_rates_);
    if (!plan.ok()) return plan.status();
    b.plan_ = plan->memory;
    b.request_.offloaded_layers = plan->offloaded_layers;
    b.request_.offloaded_inputs = plan->offloaded_inputs;
    b.request_.mlp_tile_rows = plan->memory.mlp_tile_rows;
    o.model->SetOffloadedLayers(plan->offloaded_layers, {}, plan->offloaded_inputs);
  } else {
    absl::StatusOr<memory::ActivationPlan> plan = memory::PlanCheckpointing(b.request_);
    if (!plan.ok()) return plan.status();
    b.plan_ = *plan;
    b.request_.mlp_tile_rows = plan->mlp_tile_rows;
  }
  b.planned_ = true;
  b.peak_before_ = o.peak_bytes;
  o.model->SetMlpTileRows(b.plan_.mlp_tile_rows);
  o.model->SetCheckpointedLayers(b.plan_.checkpointed_layers);
  return b;
}

int64_t CheckpointingBudget::OffloadedLayerBytes(const memory::ActivationPlanRequest& request) {
  return memory::PerTokenLayerBytes(request).plain * request.micro_batch * request.sequence_length;
}

int64_t CheckpointingBudget::OffloadedLayerBytes() const {
  return model_->offloaded_layers() > 0 ? OffloadedLayerBytes(request_) : 0;
}

std::string CheckpointingBudget::Describe() const {
  const int64_t offloaded = model_->offloaded_layers();
  const bool on_gpu = model_->device().is_cuda();
  if ((offload_requested_ > 0 || offload_auto_) && !on_gpu) {
    return absl::StrCat(DescribeSplit(), "; offload_activation_layers: ",
                        offload_auto_ ? "auto" : absl::StrCat(offload_requested_),
                        " ignored: the model is not on a GPU");
  }
  if (offload_auto_ && !offload_rates_) {
    return absl::StrCat(DescribeSplit(), "; offload_activation_layers: auto: none (",
                        offload_unmeasured_.empty()
                            ? "no layer is recomputed"
                            : absl::StrCat("the host link could not be measured: ",
                                           offload_unmeasured_),
                        ")");
  }
  std::string why;
  if (offload_rates_) {
    why = absl::StrCat(" (auto: ",
                       memory::DescribeOffloadCapacity(request_, model_->checkpointed_layers(),
                                                       *offload_rates_),
                       ")");
  }
  const int64_t inputs = model_->offloaded_inputs();
  if (offloaded == 0 && inputs > 0) {
    return absl::StrCat(DescribeSplit(), "; activation offloading", why, ": no layer's saved "
                        "tensors, but ", inputs, " checkpointed layers' inputs wait in host memory");
  }
  if (offloaded == 0) {
    return offload_rates_ ? absl::StrCat(DescribeSplit(), "; activation offloading", why, ": none")
                          : DescribeSplit();
  }
  return absl::StrCat(DescribeSplit(), "; activation offloading", why, ": ", offloaded,
                      " of them keep their saved tensors in host memory instead");
}

std::string CheckpointingBudget::DescribeSplit() const {
  const int64_t layers = static_cast<int64_t>(model_->layers.size());
  if (planned_) return memory::DescribePlan(plan_);
  const int64_t n = model_->checkpointed_layers();
  const bool top_layer_plain = !automatic_ && n > 0 && n < layers;  // true's leanest split
  return absl::StrCat("activation checkpointing: ", n, " of ", layers, " layers checkpointed (",
                      automatic_ ? "auto on a CPU without trainer.max_memory_gib: every layer"
                      : top_layer_plain
                          ? "enable_gradient_checkpointing: true; the top layer runs plainly, as "
                            "recomputing it would not lower the peak"
                      : n > 0 ? "enable_gradient_checkpointing: true"
                              : "enable_gradient_checkpointing: false",
                      model_->mlp_tile_rows() > 0
                          ? absl::StrCat("; their MLPs in tiles of ", model_->mlp_tile_rows(),
                                         " rows, as whole ones overrun the budget")
                          : "",
                      ")");
}

CheckpointingReport CheckpointingBudget::Report() const {
  CheckpointingReport r;
  r.checkpointed_layers = model_->checkpointed_layers();
  r.layers = static_cast<int64_t>(model_->layers.size());
  if (planned_) {
    r.planned_peak_bytes = plan_.planned_peak_bytes;
    r.budget_bytes = plan_.budget_bytes;
  }
  r.measured_peak_bytes = measured_peak_;
  r.offloaded_layers = model_->offloaded_layers();
  return r;
}

int64_t CheckpointingBudget::RoomForFixedBytes(int64_t peak_bytes) const {
  if (!planned_) return std::numeric_limits<int64_t>::max();
  const double allowed =
      static_cast<double>(plan_.budget_bytes) * (1 - request_.margin_fraction) -
      static_cast<double>(std::max(peak_bytes, plan_.planned_peak_bytes));
  return allowed > 0 ? static_cast<int64_t>(allowed) : 0;
}

void CheckpointingBudget::AddFixedBytes(int64_t bytes) {
  if (!planned_ || bytes <= 0) return;
  request_.built_bytes += bytes;
  plan_.planned_peak_bytes += bytes;
}

std::string CheckpointingBudget::AfterStep(int64_t step, int64_t peak_bytes) {
  if (!planned_ || step > 2 || peak_bytes <= peak_before_) return "";
  // The allocator's peak is the process's so far: no higher than an earlier step's, it is that
  // step's, whose correction is made (counting it again would checkpoint layers for nothing).
  if (peak_bytes <= measured_peak_) return "";
  measured_peak_ = peak_bytes;
  std::string line = absl::StrFormat(
      "activation checkpointing: step %d measured a peak of %s (planned %s, budget %s)", step,
      memory::FormatMemory(peak_bytes), memory::FormatMemory(plan_.planned_peak_bytes),
      memory::FormatMemory(plan_.budget_bytes));
  if (peak_bytes <= plan_.planned_peak_bytes) return line;
  // The model missed something: count it in the fixed part and plan again (with offloading, the
  // offloaded count again too: more checkpointed inputs travel).
  request_.correction_bytes += peak_bytes - plan_.planned_peak_bytes;
  if (offload_rates_) {
    absl::StatusOr<memory::OffloadedPlan> again =
        memory::PlanCheckpointingWithOffload(request_, *offload_rates_);
    // More checkpointed layers, or (the inputs alone offloaded) more inputs, or tiles now.
    const bool more_inputs = again.ok() && request_.offloaded_layers == 0 &&
                             again->offloaded_layers == 0 &&
                             again->offloaded_inputs > request_.offloaded_inputs;
    const bool tiles = again.ok() && again->memory.mlp_tile_rows != plan_.mlp_tile_rows;
    if (again.ok() &&
        (again->memory.checkpointed_layers > plan_.checkpointed_layers || more_inputs || tiles)) {
      plan_ = again->memory;
      request_.offloaded_layers = again->offloaded_layers;
      request_.offloaded_inputs = again->offloaded_inputs;
      request_.mlp_tile_rows = plan_.mlp_tile_rows;
      model_->SetMlpTileRows(plan_.mlp_tile_rows);
      model_->SetOffloadedLayers(again->offloaded_layers, {}, again->offloaded_inputs);
      model_->SetCheckpointedLayers(plan_.checkpointed_layers);
      return absl::StrCat(line, "; above the plan, so from the next step: ",
                          memory::DescribePlan(plan_), ", ",
                          more_inputs ? absl::StrCat(again->offloaded_inputs, " inputs")
                                      : absl::StrCat(again->offloaded_layers, " of them"),
                          " offloaded");
    }
  }
  absl::StatusOr<memory::ActivationPlan> replanned = memory::PlanCheckpointing(request_);
  const int64_t layers = plan_.layers;
  if (!replanned.ok()) {
    // The leanest there is: every layer, and their MLPs in tiles where a micro-batch has more rows.
    if (memory::MoreRowsThanATile(request_)) {
      request_.mlp_tile_rows = memory::kMlpTileRows;
      plan_.mlp_tile_rows = request_.mlp_tile_rows;
      model_->SetMlpTileRows(request_.mlp_tile_rows);
    }
    model_->SetCheckpointedLayers(layers);
    plan_.checkpointed_layers = layers;
    plan_.planned_peak_bytes = memory::PlannedPeakBytes(request_, layers);
    return absl::StrCat(line, "; above the plan, and even every layer checkpointed exceeds the "
                              "budget by the measured difference: now all ", layers,
                        " layers checkpointed, planned peak ",
                        memory::FormatMemory(plan_.planned_peak_bytes));
  }
  // Tiles the plan had not taken are a change even at the same split (they lower its peak).
  if (replanned->checkpointed_layers <= plan_.checkpointed_layers &&
      replanned->mlp_tile_rows == plan_.mlp_tile_rows) {
    plan_.planned_peak_bytes = memory::PlannedPeakBytes(request_, plan_.checkpointed_layers);
    return absl::StrCat(line, "; above the plan but within the budget: the split stays");
  }
  plan_ = *replanned;
  request_.mlp_tile_rows = plan_.mlp_tile_rows;
  // The split only grows (a tiled plan may fit with fewer; keeping them costs no memory).
  plan_.checkpointed_layers = std::max(plan_.checkpointed_layers, model_->checkpointed_layers());
  plan_.planned_peak_bytes = memory::PlannedPeakBytes(request_, plan_.checkpointed_layers);
  model_->SetMlpTileRows(plan_.mlp_tile_rows);
  model_->SetCheckpointedLayers(plan_.checkpointed_layers);
  return absl::StrCat(line, "; above the plan, so from the next step: ", memory::DescribePlan(plan_));
}

}  // namespace qlora::memory
