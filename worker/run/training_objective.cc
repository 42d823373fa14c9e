// The causal-LM objective of finetune jobs, and the factory (see training_objective.h).
#include "worker/run/training_objective.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "worker/engine/causal_lm_loss.h"
#include "worker/run/evaluation.h"
#include "worker/run/preference_objective.h"

namespace qlora::worker {
namespace {

class CausalLmObjective : public TrainingObjective {
 public:
  std::vector<std::string> MetricNames() const override { return {}; }
  int64_t LossUnits(const DeviceBatch& batch) const override { return batch.target_tokens; }
  absl::Status BeforeStep(engine::LlamaForCausalLM&, const std::vector<DeviceBatch>&) override {
    return absl::OkStatus();
  }

  MicroBatchLoss Loss(engine::LlamaForCausalLM& model, const DeviceBatch& b, int, double grad_scale) override {
    at::Tensor hidden;
    {
      RECORD_USER_SCOPE("qlora::forward");
      hidden = model.Forward(b.input_ids, b.forward);
    }
    RECORD_USER_SCOPE("qlora::loss");
    engine::LossOptions options;
    options.grad_scale = grad_scale;
    options.count_tokens = false;  // b.target_tokens has it, counted on the host
    return {engine::ComputeCausalLmLoss(hidden, model.lm_head, b.labels, options).loss_sum, at::Tensor()};
  }

  absl::StatusOr<EvalOutcome> Evaluate(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                       comm::Communicator& comm) override {
    EvalOutcome outcome;
    absl::StatusOr<double> loss = EvaluateLoss(model, source, comm);
    if (!loss.ok()) return loss.status();
    outcome.loss = *loss;
    return outcome;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingObjective>> MakeObjective(const JobConfig& job,
                                                                 const engine::LlamaForCausalLM& model) {
  const TrainerConfig& t = job.trainer;
  switch (t.type) {
    case TrainerType::kFinetune:
      return std::unique_ptr<TrainingObjective>(new CausalLmObjective());
    case TrainerType::kDpo:
    case TrainerType::kOrpo: {
      PreferenceLossOptions options;
      options.type = t.type;
      options.beta = t.beta;
      options.loss_type = t.loss_type;
      options.label_smoothing = t.label_smoothing;
      return std::unique_ptr<TrainingObjective>(
          new PreferenceObjective(options, model, !job.lora.pretrained_adapter_path.empty()));
    }
    case TrainerType::kNone:
      break;
  }
  return absl::InvalidArgumentError("trainer.type none trains nothing");
}

}  // namespace qlora::worker
