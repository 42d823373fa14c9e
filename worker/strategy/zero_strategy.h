// ZeroStrategy implements DistributedStrategy for ZeRO stages 0-3 from one plan of what is
// partitioned (the factory, MakeStrategy in strategy.cc, is the only place that maps a stage to a plan):
//   stage 0: nothing      - replicated fp32 master + AdamW state; full gradients all-reduced in
//                           buckets at the boundary.
//   stage 1: optimizer    - fp32 master + AdamW state for this rank's partition only; full
//                           gradients kept until the boundary, then reduce-scattered to owners.
//   stage 2: + gradients  - gradients reduced to their owners bucket by bucket as backward
//                           produces them; each rank keeps only its partition's sum.
//   stage 3: + base weights - the frozen base weights are partitioned too (PlanBaseWeights in
//                           strategy.h gives the model their all-gather); the trainable
//                           parameters are handled as in stage 2.
// Stages 1 to 3 all-gather the updated partitions into the parameters after each step.
// Internal to worker/strategy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/comm/communicator.h"
#include "worker/optim/adamw.h"
#include "worker/strategy/flat_layout.h"
#include "worker/strategy/strategy.h"

namespace qlora::strategy {

struct ZeroPlan {
  int stage = 0;                     // for reports and manifests only
  bool partition_optimizer = false;  // master + AdamW state for own partition only
  bool partition_gradients = false;  // reduce during backward, keep own partition only
  bool partition_base_weights = false;  // the frozen base weights too (BaseWeightPartition)
};

class ZeroStrategy final : public DistributedStrategy {
 public:
  // Use MakeStrategy; Init() must succeed before anything else.
  ZeroStrategy(const ZeroPlan& plan, const StrategyOptions& options,
               comm::Communicator& communicator, std::vector<TrainableParam> params);
  absl::Status Init();

  absl::StatusOr<LossScale> ComputeLossScale(int64_t local_target_tokens) override;
  absl::Status OnGradientReady(int param_index, const at::Tensor& grad) override;
  absl::Status OnGradientsReady(const std::vector<int>& param_indices,
                                const std::vector<at::Tensor>& grads) override;
  absl::Status EndMicroBatch() override;
  absl::StatusOr<PendingStepReport> QueueStep(double lr) override;
  int64_t steps_taken() const override { return adamw_->step(); }
  MemoryReport Memory() const override;
  StrategyDescription Describe() const override;
  absl::Status SaveCheckpoint(const std::string& dir) override;
  absl::StatusOr<ResumeReport> LoadCheckpoint(const std::string& dir) override;
  absl::StatusOr<std::vector<at::Tensor>> GatherMasterWeights() override;
  const std::vector<TrainableParam>& params() const override { return params_; }

 private:
  // Stage 2: a run of consecutive parameters (contiguous in the flat buffer) reduced together.
  struct Bucket {
    FlatRange range;
    int first_param = 0;
    int last_param = 0;     // inclusive
    int pending = 0;        // parameters not yet reported in this micro-batch
    at::Tensor staging;     // (range.size(),) fp32 while filling, undefined otherwise
  };

  absl::Status Collective(const absl::Status& status);
  // One rank owns every partition: nothing to reduce, no collective needed.
  bool Alone() const { return comm_.world_size() == 1; }
  // Stage 2 across ranks: gradients go through the buckets' reduce-scatters as they appear. Alone,
  // its gradients go straight into grad_ (as under stages 0-1).
  bool ReducesInBuckets() const { return plan_.partition_gradients && !Alone(); }
  // INVALID_ARGUMENT unless `grad` is parameter `param_index`'s size.
  absl::Status CheckGradient(int param_index, const at::Tensor& grad) const;
  at::TensorOptions Fp32() const;
  FlatRange Owned() const;  // the flat range this rank keeps master + AdamW state for
  void NoteCommBuffer(int64_t bytes);

  // Stage 2 buckets.
  void PlanBuckets();
  absl::Status LaunchReadyBuckets(bool flush);

  // Rebuilds the full flat fp32 parameter buffer from the owned masters (all-gather when
  // partitioned) and copies it into the parameters.
  absl::Status PublishMaster();
  absl::StatusOr<at::Tensor> FullMaster();

  ZeroPlan plan_;
  StrategyOptions options_;
  comm::Communicator& comm_;
  std::vector<TrainableParam> params_;
  FlatLayout layout_;

  // When every parameter is fp32 (LoRA weights are), the parameters are views into `flat_` (as
  // DeepSpeed's flattened groups) and master_ is the owned slice of it: the optimizer updates
  // the parameters in place and no second fp32 copy of them exists. Otherwise master_ is a
  // separate fp32 copy and flat_ is undefined.
  at::Tensor flat_;           // (padded_numel,) fp32, aliased by the parameters
  at::Tensor master_;         // (Owned().size(),) fp32
  std::unique_ptr<optim::AdamW> adamw_;
  at::Tensor grad_;           // (padded_numel,) fp32 for stages 0-1; (partition_numel,) for 2
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  std::vector<bool> reported_;  // this micro-batch
  int next_bucket_ = 0;
  int64_t live_comm_bytes_ = 0;
  int64_t peak_comm_bytes_ = 0;
  absl::Status broken_;
};

}  // namespace qlora::strategy
