// Preference tuning as a TrainingObjective: DPO and ORPO over micro-batches of pairs (the chosen
// sequences in the first half of the rows, the rejected ones in the second: batcher.h), equal to
// TRL's DPOTrainer and ORPOTrainer (preference_loss.h has the formulas).
//
// Forward passes per step, for n micro-batches: DPO runs 2n, ORPO n. Each policy forward takes
// chosen and rejected together (one batch of 2 x pairs rows); DPO's reference log-probabilities
// come from the same model with the adapter swapped out (the base with the adapter disabled;
// for a job that starts from an adapter, that adapter as it was loaded, kept frozen: TRL's
// reference for a trained adapter), computed with no graph, without activation checkpointing,
// before the step's policy forwards (LlamaForCausalLM::SwapAdapters), so no second model is
// ever in memory. With a partitioned or host-resident base every rank runs the same forwards, as
// the store's collective gathers need.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "worker/run/preference_loss.h"
#include "worker/run/training_objective.h"

namespace qlora::worker {

class PreferenceObjective : public TrainingObjective {
 public:
  // `model`'s adapters as they are now are the reference of a job that started from an adapter
  // (`from_adapter`); otherwise the reference is the base alone.
  PreferenceObjective(PreferenceLossOptions options, const engine::LlamaForCausalLM& model, bool from_adapter);

  std::vector<std::string> MetricNames() const override { return PreferenceMetricNames(options_.type); }
  int64_t LossUnits(const DeviceBatch& batch) const override { return batch.pairs > 0 ? 1 : 0; }
  absl::Status BeforeStep(engine::LlamaForCausalLM& model, const std::vector<DeviceBatch>& batches) override;
  MicroBatchLoss Loss(engine::LlamaForCausalLM& model, const DeviceBatch& batch, int index,
                      double grad_scale) override;
  absl::StatusOr<EvalOutcome> Evaluate(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                       comm::Communicator& comm) override;

 private:
  // [rows] summed completion log-probabilities of the reference.
  absl::StatusOr<at::Tensor> ReferenceLogProbs(engine::LlamaForCausalLM& model, const DeviceBatch& batch);

  PreferenceLossOptions options_;
  // Per layer and projection: the reference's adapters (empty entries: none), swapped in for
  // the reference forwards.
  std::vector<std::optional<engine::LoraWeights>> reference_;
  std::vector<at::Tensor> reference_logps_;  // the step's, per micro-batch
};

}  // namespace qlora::worker
