// What a training step minimises, as the trainer sees it: the causal-LM loss of supervised
// fine-tuning (trainer.type finetune), or a preference loss over pairs (dpo, orpo:
// preference_objective.h). The trainer runs the step (micro-batches, backward, the strategy's
// reduction and update) and never asks which objective it has; the objective owns each
// micro-batch's forward and loss and says what the step's loss is a mean over.
//
// Normalisation: a step's loss is sum(loss sums of every rank's micro-batches) / sum(their
// LossUnits): target tokens for finetune (transformers' num_items_in_batch), micro-batches for
// preference tuning (TRL's trainers average each micro-batch's loss, and the accumulated ones are
// averaged again: the same mean over every rank's micro-batches).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "worker/comm/communicator.h"
#include "worker/engine/llama_model.h"
#include "worker/run/micro_batches.h"

namespace qlora::worker {

struct MicroBatchLoss {
  at::Tensor loss_sum;  // float32 scalar, differentiable: the loss summed over the batch's units
  at::Tensor metrics;   // [MetricNames().size()] float64, detached (undefined without metrics)
};

// An evaluation over a validation source (every rank; collective).
struct EvalOutcome {
  double loss = 0;                                    // NaN without data
  std::vector<std::pair<std::string, double>> metrics;  // MetricNames()' values
};

class TrainingObjective {
 public:
  virtual ~TrainingObjective() = default;

  // The metrics each micro-batch reports (TRL's names for preference tuning; none for finetune).
  virtual std::vector<std::string> MetricNames() const = 0;
  // What the step's loss is a mean over, counted in `batch` (see the file comment).
  virtual int64_t LossUnits(const DeviceBatch& batch) const = 0;
  // Before the step's forwards, outside its adapter-copy scope, with every micro-batch of it:
  // preference tuning computes the reference log-probabilities here (no graph).
  virtual absl::Status BeforeStep(engine::LlamaForCausalLM& model, const std::vector<DeviceBatch>& batches) = 0;
  // Micro-batch `index` of the step: its forward and loss. grad_scale is the factor backward
  // will bring to loss_sum (the step's 1 / global units; 1 when nothing counts).
  virtual MicroBatchLoss Loss(engine::LlamaForCausalLM& model, const DeviceBatch& batch, int index,
                              double grad_scale) = 0;
  // The loss (and metrics) over `source` in evaluation mode, summed over every rank.
  virtual absl::StatusOr<EvalOutcome> Evaluate(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                               comm::Communicator& comm) = 0;
};

// The job's objective: finetune, dpo or orpo (trainer.type). `model` is the job's, its adapters
// in place (the reference of a job that starts from an adapter is that adapter).
absl::StatusOr<std::unique_ptr<TrainingObjective>> MakeObjective(const JobConfig& job,
                                                                 const engine::LlamaForCausalLM& model);

}  // namespace qlora::worker
