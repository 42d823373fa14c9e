// StepBatches (see step_batches.h).
#include "worker/run/step_batches.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/data_loader.h"
#include "worker/run/rank_sums.h"

namespace qlora::worker {
namespace {

// One step's micro-batches from `source`.
absl::StatusOr<std::vector<DeviceBatch>> ReadStep(MicroBatchSource* source, int accumulation) {
  std::vector<DeviceBatch> batches;
  for (int i = 0; i < accumulation; ++i) {
    QLORA_ASSIGN_OR_RETURN(std::optional<DeviceBatch> batch, source->Next());
    if (!batch) return absl::InternalError("the data ran out before the epoch's planned steps");
    batches.push_back(std::move(*batch));
  }
  return batches;
}

}  // namespace

StepBatches::~StepBatches() {
  if (ahead_.valid()) ahead_.wait();
}

absl::StatusOr<StepBatches> StepBatches::Start(MicroBatchSource* source, comm::Communicator* comm,
                                               const at::Device& device, int accumulation,
                                               int micro_batch_rows) {
  StepBatches steps(source, comm, device, accumulation, micro_batch_rows);
  QLORA_ASSIGN_OR_RETURN(steps.epoch_steps_, steps.PlanEpoch(0));
  steps.first_epoch_steps_ = steps.epoch_steps_;
  return steps;
}

absl::StatusOr<int64_t> StepBatches::PlanEpoch(int epoch) {
  QLORA_ASSIGN_OR_RETURN(data::EpochCount local, source_->CountMicroBatches(epoch));
  std::vector<double> one_hot(comm_->world_size(), 0.0);
  one_hot[comm_->rank()] = static_cast<double>(local.micro_batches);
  QLORA_ASSIGN_OR_RETURN(std::vector<double> counts, SumOverRanks(*comm_, one_hot, device_));
  std::vector<int64_t> per_rank(counts.begin(), counts.end());
  QLORA_ASSIGN_OR_RETURN(data::EpochPlan plan, data::PlanEpoch(per_rank, accumulation_));
  if (plan.optimizer_steps == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the dataset is too small: a rank has ", *std::min_element(per_rank.begin(), per_rank.end()),
        " micro-batches of ", rows_, " but one optimizer step needs ", accumulation_,
        " per rank (gradient_accumulation_steps)"));
  }
  QLORA_RETURN_IF_ERROR(source_->Restart(epoch));
  epoch_examples_ = local.examples;
  epoch_records_ = RecordCounts();
  epoch_records_.malformed = local.malformed;
  epoch_records_.without_target = local.without_target;
  return plan.optimizer_steps;
}

absl::StatusOr<std::vector<DeviceBatch>> StepBatches::Next() {
  if (in_epoch_ == epoch_steps_) {
    earlier_records_ = total_records();
    ++epoch_;
    in_epoch_ = 0;
    QLORA_ASSIGN_OR_RETURN(epoch_steps_, PlanEpoch(epoch_));
  }
  absl::StatusOr<std::vector<DeviceBatch>> batches =
      ahead_.valid() ? ahead_.get() : ReadStep(source_, accumulation_);
  if (!batches.ok()) return batches.status();
  for (const DeviceBatch& batch : *batches) epoch_records_.trained += batch.examples;
  ++in_epoch_;
  if (in_epoch_ == epoch_steps_) {
    epoch_records_.left_over = epoch_examples_ - epoch_records_.trained;
  } else {
    ahead_ = std::async(std::launch::async, ReadStep, source_, accumulation_);
  }
  return batches;
}

RecordCounts StepBatches::total_records() const {
  RecordCounts total = earlier_records_;
  total.trained += epoch_records_.trained;
  total.left_over += epoch_records_.left_over;
  total.malformed += epoch_records_.malformed;
  total.without_target += epoch_records_.without_target;
  return total;
}

absl::Status StepBatches::Skip(int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) QLORA_RETURN_IF_ERROR(Next().status());
  return absl::OkStatus();
}

}  // namespace qlora::worker
