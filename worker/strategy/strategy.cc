// MakeStrategy (the only place that maps a ZeRO stage to a plan), the shared
// DistributedStrategy::TakeGradsFromParams, OnGradientsReady and Step, and PendingStepReport.
#include "worker/strategy/strategy.h"

#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/optim/clip.h"
#include "worker/strategy/zero_strategy.h"

namespace qlora::strategy {

absl::Status DistributedStrategy::OnGradientsReady(const std::vector<int>& param_indices,
                                                   const std::vector<at::Tensor>& grads) {
  if (param_indices.size() != grads.size()) {
    return absl::InvalidArgumentError("strategy: one gradient per parameter index");
  }
  for (size_t k = 0; k < grads.size(); ++k) {
    QLORA_RETURN_IF_ERROR(OnGradientReady(param_indices[k], grads[k]));
  }
  return absl::OkStatus();
}

absl::Status DistributedStrategy::TakeGradsFromParams() {
  const std::vector<TrainableParam>& all = params();
  std::vector<int> indices;
  std::vector<at::Tensor> grads;
  for (int i = static_cast<int>(all.size()) - 1; i >= 0; --i) {
    at::Tensor& grad = all[i].tensor.mutable_grad();
    if (!grad.defined()) continue;
    indices.push_back(i);
    grads.push_back(std::exchange(grad, at::Tensor()));
  }
  return OnGradientsReady(indices, grads);
}

PendingStepReport::PendingStepReport(StepReport known, ScalarRead grad_norm, double max_grad_norm)
    : known_(known), grad_norm_(std::move(grad_norm)), max_grad_norm_(max_grad_norm) {}

StepReport PendingStepReport::Get() const {
  StepReport report = known_;
  report.grad_norm = grad_norm_.Get();
  report.clip_coefficient = optim::ClipCoefficient(report.grad_norm, max_grad_norm_);
  return report;
}

absl::StatusOr<StepReport> DistributedStrategy::Step(double lr) {
  QLORA_ASSIGN_OR_RETURN(PendingStepReport pending, QueueStep(lr));
  return pending.Get();
}

namespace {

absl::StatusOr<ZeroPlan> PlanForStage(int stage) {
  ZeroPlan plan;
  plan.stage = stage;
  switch (stage) {
    case 0: break;
    case 1: plan.partition_optimizer = true; break;
    case 2: plan.partition_optimizer = plan.partition_gradients = true; break;
    case 3:
      plan.partition_optimizer = plan.partition_gradients = plan.partition_base_weights = true;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("ZeRO stage ", stage, " is not 0-3"));
  }
  return plan;
}

}  // namespace

absl::StatusOr<BaseWeightPartition> PlanBaseWeights(int stage, const StrategyOptions& options,
                                                    comm::Communicator& communicator) {
  QLORA_ASSIGN_OR_RETURN(const ZeroPlan plan, PlanForStage(stage));
  BaseWeightPartition partition;
  if (!plan.partition_base_weights) return partition;
  partition.partitioned = true;
  partition.rank = communicator.rank();
  partition.world_size = communicator.world_size();
  if (partition.world_size > 1) {
    const absl::Duration timeout = options.collective_timeout;
    partition.all_gather = [&communicator, timeout](const at::Tensor& shard,
                                                    const at::Tensor& full) {
      return communicator.AllGather(shard, full, timeout);
    };
  }
  return partition;
}

absl::StatusOr<std::unique_ptr<DistributedStrategy>> MakeStrategy(
    int stage, const StrategyOptions& options, comm::Communicator& communicator,
    std::vector<TrainableParam> params) {
  QLORA_ASSIGN_OR_RETURN(const ZeroPlan plan, PlanForStage(stage));
  auto strategy =
      std::make_unique<ZeroStrategy>(plan, options, communicator, std::move(params));
  try {
    QLORA_RETURN_IF_ERROR(strategy->Init());
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("strategy init: ", e.what_without_backtrace()));
  }
  return std::unique_ptr<DistributedStrategy>(std::move(strategy));
}

}  // namespace qlora::strategy
