// MakeObjective: the job's objective (see training_objective.h).
#include "worker/run/training_objective.h"

#include "worker/run/causal_lm_objective.h"
#include "worker/run/preference_objective.h"

namespace qlora::worker {

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
