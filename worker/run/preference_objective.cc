// DPO and ORPO micro-batches: reference and policy forwards, per-sequence log-probabilities (see
// preference_objective.h).
#include "worker/run/preference_objective.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "worker/engine/token_log_probs.h"
#include "worker/run/rank_sums.h"

namespace qlora::worker {
namespace {

// The reference's adapters in place until the scope ends.
class SwappedAdapters {
 public:
  SwappedAdapters(engine::LlamaForCausalLM& model, std::vector<std::optional<engine::LoraWeights>>* adapters)
      : model_(model), adapters_(adapters) {
    status_ = model_.SwapAdapters(adapters_);
  }
  ~SwappedAdapters() {
    if (status_.ok()) model_.SwapAdapters(adapters_).IgnoreError();  // the same size: cannot fail
  }
  const absl::Status& status() const { return status_; }

 private:
  engine::LlamaForCausalLM& model_;
  std::vector<std::optional<engine::LoraWeights>>* adapters_;
  absl::Status status_;
};

// Every token of each row but its padding (on the host): what ORPO's NLL is a mean over.
at::Tensor WholeSequenceTargets(const DeviceBatch& b) {
  const at::Tensor& ids = b.host_input_ids;
  const at::Tensor positions = at::arange(ids.size(1), ids.options()).unsqueeze(0);
  return at::where(positions < b.lengths.unsqueeze(1), ids, at::full({}, engine::kIgnoreIndex, ids.options()));
}

}  // namespace

PreferenceObjective::PreferenceObjective(PreferenceLossOptions options, const engine::LlamaForCausalLM& model,
                                         bool from_adapter)
    : options_(options) {
  for (const engine::DecoderLayer& layer : model.layers) {
    for (const auto& name : engine::kLinearModuleNames) {
      const std::optional<engine::LoraWeights>& lora = layer.Linear(name).lora;
      if (!from_adapter || !lora) {
        reference_.emplace_back();
        continue;
      }
      engine::LoraWeights frozen = *lora;
      frozen.a = lora->a.detach().clone();
      frozen.b = lora->b.detach().clone();
      frozen.dropout = 0;
      reference_.emplace_back(std::move(frozen));
    }
  }
}

absl::StatusOr<at::Tensor> PreferenceObjective::ReferenceLogProbs(engine::LlamaForCausalLM& model,
                                                                  const DeviceBatch& batch) {
  RECORD_USER_SCOPE("qlora::reference");
  c10::NoGradGuard no_grad;
  const engine::EvalModeScope eval(model);
  const SwappedAdapters swapped(model, &reference_);
  QLORA_RETURN_IF_ERROR(swapped.status());
  const at::Tensor hidden = model.Forward(batch.input_ids, batch.forward);
  const engine::TokenLogProbs t = engine::ComputeTokenLogProbs(hidden, model.lm_head, batch.host_labels);
  return t.logps.sum(1);
}

absl::Status PreferenceObjective::BeforeStep(engine::LlamaForCausalLM& model, const std::vector<DeviceBatch>& batches) {
  reference_logps_.clear();
  if (options_.type != TrainerType::kDpo) return absl::OkStatus();
  for (const DeviceBatch& b : batches) {
    QLORA_ASSIGN_OR_RETURN(at::Tensor logps, ReferenceLogProbs(model, b));
    reference_logps_.push_back(std::move(logps));
  }
  return absl::OkStatus();
}

MicroBatchLoss PreferenceObjective::Loss(engine::LlamaForCausalLM& model, const DeviceBatch& b, int index,
                                         double grad_scale) {
  (void)grad_scale;  // the loss is a handful of scalars: backward's scale costs nothing there
  TORCH_CHECK(b.pairs > 0 && b.input_ids.size(0) == 2 * b.pairs, "a preference micro-batch has 2 x pairs rows");
  at::Tensor hidden;
  {
    RECORD_USER_SCOPE("qlora::forward");
    hidden = model.Forward(b.input_ids, b.forward);
  }
  RECORD_USER_SCOPE("qlora::loss");
  const int64_t n = b.pairs;
  const bool orpo = options_.type == TrainerType::kOrpo;
  // ORPO's chosen rows are trained on prompt and completion (its NLL term); the completion mask
  // picks the preference terms' tokens out of them.
  const at::Tensor targets =  // on the host
      orpo ? at::cat({WholeSequenceTargets(b).slice(0, 0, n), b.host_labels.slice(0, n)}, 0) : b.host_labels;
  const engine::TokenLogProbs t = engine::ComputeTokenLogProbs(hidden, model.lm_head, targets);
  const at::Tensor completion = (b.labels != engine::kIgnoreIndex).to(at::kFloat);
  const at::Tensor logps = (t.logps * completion).sum(1);
  const at::Tensor tokens = completion.sum(1);
  const at::Tensor logits = (t.mean_logits * completion).sum(1);
  PairLogProbs p;
  p.chosen = logps.slice(0, 0, n);
  p.rejected = logps.slice(0, n);
  p.chosen_tokens = tokens.slice(0, 0, n);
  p.rejected_tokens = tokens.slice(0, n);
  p.chosen_logits = logits.slice(0, 0, n);
  p.rejected_logits = logits.slice(0, n);
  if (orpo) {
    // The chosen rows' log-probabilities are 0 but at their targets (every token but the first
    // and the padding), which are counted on the host.
    const int64_t counted = (targets.slice(0, 0, n).slice(1, 1) != engine::kIgnoreIndex).sum().item<int64_t>();
    p.chosen_nll = -t.logps.slice(0, 0, n).sum() / static_cast<double>(std::max<int64_t>(counted, 1));
  } else {
    TORCH_CHECK(index >= 0 && static_cast<size_t>(index) < reference_logps_.size(),
                "no reference log-probabilities for micro-batch ", index, ": BeforeStep not called");
    const at::Tensor& ref = reference_logps_[index];
    p.ref_chosen = ref.slice(0, 0, n);
    p.ref_rejected = ref.slice(0, n);
  }
  PreferenceLossResult r = ComputePreferenceLoss(p, options_);
  return {r.loss, r.metrics};
}

absl::StatusOr<EvalOutcome> PreferenceObjective::Evaluate(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                                          comm::Communicator& comm) {
  const std::vector<std::string> names = MetricNames();
  // loss x pairs, pairs, micro-batches, then each metric summed over micro-batches.
  std::vector<double> sums(3 + names.size(), 0.0);
  QLORA_RETURN_IF_ERROR(source.Restart(0));
  while (true) {
    QLORA_ASSIGN_OR_RETURN(std::optional<DeviceBatch> batch, source.Next());
    if (!batch) break;
    QLORA_RETURN_IF_ERROR(BeforeStep(model, {*batch}));
    c10::NoGradGuard no_grad;
    const engine::EvalModeScope eval(model);
    const MicroBatchLoss loss = Loss(model, *batch, 0, 1.0);
    sums[0] += loss.loss_sum.item<double>() * static_cast<double>(batch->pairs);
    sums[1] += static_cast<double>(batch->pairs);
    sums[2] += 1;
    const at::Tensor metrics = loss.metrics.cpu();
    for (size_t i = 0; i < names.size(); ++i) sums[3 + i] += metrics[static_cast<int64_t>(i)].item<double>();
  }
  QLORA_ASSIGN_OR_RETURN(const std::vector<double> total, SumOverRanks(comm, sums, model.device()));
  EvalOutcome outcome;
  // As transformers' evaluation loop: each batch's loss weighted by its size; TRL's metrics are
  // the mean over the batches.
  outcome.loss = total[1] > 0 ? total[0] / total[1] : NAN;
  for (size_t i = 0; i < names.size() && total[2] > 0; ++i) outcome.metrics.emplace_back(names[i], total[3 + i] / total[2]);
  return outcome;
}

}  // namespace qlora::worker
