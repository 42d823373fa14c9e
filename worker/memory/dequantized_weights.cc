// trainer.dequantized_weight_layers: the count, or auto's choice after the first step (see
// dequantized_weights.h).
#include "worker/memory/dequantized_weights.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/memory/activation_plan.h"
#include "worker/memory/memory_budget.h"

namespace qlora::memory {
namespace {

std::string Held(const engine::LlamaForCausalLM& model) {
  const int64_t n = model.dequantized_layers();
  return absl::StrCat(n, " of ", model.layers.size(), " layers hold their weights dequantized (",
                      memory::FormatMemory(n * model.DequantizedLayerBytes()), ")");
}

}  // namespace

DequantizedWeights DequantizedWeights::Start(const DequantizedWeightsOptions& o,
                                             std::string* line) {
  DequantizedWeights d;
  d.model_ = o.model;
  const TrainerConfig& t = *o.trainer;
  line->clear();
  if (t.dequantized_weights_auto) {
    if (!o.device.is_cuda()) {
      *line = "dequantized_weight_layers: auto: none (the model is not on a GPU)";
      return d;
    }
    d.pending_auto_ = true;
    d.budget_bytes_ = MemoryBudgetBytes(t, o.available_bytes);
    *line = absl::StrCat("dequantized_weight_layers: auto: chosen after the first step, for a ",
                         memory::FormatMemory(d.budget_bytes_), " budget");
  } else if (t.dequantized_weight_layers > 0 && o.model->DequantizedLayerBytes() == 0) {
    *line = absl::StrCat("dequantized_weight_layers: ", t.dequantized_weight_layers,
                         " ignored: the model has no 4-bit weights it could hold dequantized "
                         "(none, or they are partitioned or in host memory)");
  } else if (t.dequantized_weight_layers > 0) {
    o.model->SetDequantizedLayers(t.dequantized_weight_layers);
    *line = absl::StrCat("dequantized_weight_layers: ", Held(*o.model));
  }
  return d;
}

int64_t DequantizedWeights::FittingLayers(int64_t budget_bytes, int64_t peak_bytes,
                                          int64_t layer_bytes, int64_t max_layers,
                                          int64_t reserve_bytes, int64_t limit_bytes) {
  if (layer_bytes <= 0) return 0;
  const double room = std::min(static_cast<double>(budget_bytes) * (1 - kMarginFraction) -
                                   static_cast<double>(peak_bytes),
                               static_cast<double>(limit_bytes)) -
                      static_cast<double>(reserve_bytes);
  if (room <= 0) return 0;
  return std::min<int64_t>(max_layers, static_cast<int64_t>(room / layer_bytes));
}

int64_t DequantizedWeights::AfterStep(int64_t step, const AllocatorPeak& peak,
                                      int64_t reserve_bytes, int64_t limit_bytes,
                                      std::string* line) {
  line->clear();
  if (!pending_auto_ || step != 1) return 0;
  pending_auto_ = false;
  const int64_t layer_bytes = model_->DequantizedLayerBytes();
  const int64_t reserve = std::max<int64_t>(reserve_bytes, 0);
  const int64_t peak_bytes = std::max(peak.allocated, peak.reserved);
  model_->SetDequantizedLayers(FittingLayers(budget_bytes_, peak_bytes, layer_bytes,
                                             static_cast<int64_t>(model_->layers.size()),
                                             reserve, limit_bytes));
  *line = absl::StrCat("dequantized_weight_layers: auto: the first step peaked at ",
                       memory::FormatMemory(peak.allocated), " allocated, ",
                       memory::FormatMemory(peak_bytes), " reserved, of a ",
                       memory::FormatMemory(budget_bytes_), " budget",
                       reserve > 0 ? absl::StrCat(" (less ", memory::FormatMemory(reserve),
                                                  " for one more offloaded layer in transit)")
                                   : "",
                       ", so from the next step ", Held(*model_));
  return model_->dequantized_layers() * layer_bytes;
}

}  // namespace qlora::memory
