// Supervised fine-tuning as a TrainingObjective: the causal-LM loss summed over the micro-batch's
// target tokens (causal_lm_loss.h), the step's loss a mean over every rank's target tokens as
// transformers' num_items_in_batch makes it; evaluation is EvaluateLoss (evaluation.h).
#pragma once

#include <string>
#include <vector>

#include "worker/run/training_objective.h"

namespace qlora::worker {

class CausalLmObjective : public TrainingObjective {
 public:
  std::vector<std::string> MetricNames() const override { return {}; }
  int64_t LossUnits(const DeviceBatch& batch) const override { return batch.target_tokens; }
  absl::Status BeforeStep(engine::LlamaForCausalLM&, const std::vector<DeviceBatch>&) override {
    return absl::OkStatus();
  }
  MicroBatchLoss Loss(engine::LlamaForCausalLM& model, const DeviceBatch& batch, int index,
                      double grad_scale) override;
  absl::StatusOr<EvalOutcome> Evaluate(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                       comm::Communicator& comm) override;
};

}  // namespace qlora::worker
