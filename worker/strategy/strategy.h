// DistributedStrategy: how the trainable (LoRA) parameters of a data-parallel job are reduced,
// optimised and checkpointed under a ZeRO stage. MakeStrategy turns the resolved stage into one;
// nothing outside the strategies asks which stage a job runs: callers ask the strategy what to
// reduce, what it owns and how to save.
//
// Contract with the training engine, per optimizer step (gradient accumulation of G micro-batches):
//
//   auto scale = strategy->ComputeLossScale(local_target_tokens_of_this_step);   // collective
//   for each of the G micro-batches:
//     loss = sum over the micro-batch's target tokens of token losses, times scale->scale
//     loss.backward()   // from autograd hooks: OnGradientReady(i, grad) as gradients appear,
//                       // or afterwards: TakeGradsFromParams()
//     strategy->EndMicroBatch();                                           // collective (stage 2)
//   auto report = strategy->Step(lr);                                      // collective
//   // params now hold the updated weights on every rank
//
// Gradients are SUMMED over ranks and micro-batches; LossScale gives 1 / (target tokens of the
// whole global batch), so the result is the gradient of the mean token loss of the global batch,
// which is what one process with the same global batch computes.
//
// Every method except Memory() and the accessors is a collective: all ranks call it in the same
// order. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/optim/adamw.h"
#include "worker/strategy/scalar_read.h"

namespace qlora::strategy {

// One trainable parameter, as the engine owns it (a leaf tensor, any floating dtype, on the
// communicator's device). Order and names must be identical on every rank.
struct TrainableParam {
  std::string name;
  at::Tensor tensor;
};

struct StrategyOptions {
  optim::AdamWOptions adamw;
  optim::MomentsPlacement adamw_moments;  // offload_optimizer: {device: cpu}: in host memory
  double max_grad_norm = 1.0;            // <= 0: no clipping
  int64_t bucket_elements = 500000000;   // DeepSpeed's reduce_bucket_size default
  absl::Duration collective_timeout = absl::Minutes(5);
};

// Bytes this rank holds for the trainable parameters (not the model itself).
struct MemoryReport {
  int64_t master_bytes = 0;       // fp32 master weights
  int64_t optimizer_bytes = 0;    // AdamW exp_avg + exp_avg_sq held on the device between steps
  int64_t optimizer_host_bytes = 0;  // the same in host memory (offload_optimizer), not in total
  int64_t gradient_bytes = 0;     // accumulated gradients kept between micro-batches
  int64_t comm_buffer_bytes = 0;  // peak of transient communication buffers so far
  int64_t total() const {
    return master_bytes + optimizer_bytes + gradient_bytes + comm_buffer_bytes;
  }
};

struct LossScale {
  int64_t global_target_tokens = 0;
  double scale = 0;  // 1 / global_target_tokens
};

struct StepReport {
  int64_t step = 0;              // optimizer steps taken, this one included
  double lr = 0;
  double grad_norm = 0;          // global L2 norm before clipping
  double clip_coefficient = 1;   // what the gradients were multiplied by
};

// A step's report whose gradient norm may still be on its way to the host (QueueStep below):
// Get() waits for that copy only, not for the work queued after it, so a caller that reads it
// late (the trainer, once the next step is queued) never drains the device's queue.
class PendingStepReport {
 public:
  PendingStepReport() = default;
  // `known` less the norm and the clipping coefficient, which Get() fills from `grad_norm` and
  // `max_grad_norm` (<= 0: no clipping).
  PendingStepReport(StepReport known, ScalarRead grad_norm, double max_grad_norm);

  StepReport Get() const;

 private:
  StepReport known_;
  ScalarRead grad_norm_;
  double max_grad_norm_ = 0;
};

// What a strategy is, for the job's reports: the stage it runs and this rank's share.
struct StrategyDescription {
  int stage = 0;
  int world_size = 1;
  int64_t trainable_elements = 0;    // all trainable parameters (unpadded)
  int64_t partition_elements = 0;    // elements this rank keeps fp32 master + AdamW state for
  bool partitions_optimizer_state = false;
  bool partitions_gradients = false;
  bool partitions_base_weights = false;  // the frozen base weights (PlanBaseWeights)
};

struct ResumeReport {
  int64_t step = 0;           // optimizer steps the checkpoint had taken
  int saved_world_size = 0;
  int saved_stage = 0;
  bool repartitioned = false;  // saved and current partitioning differ
  std::string description;     // one line for the job log
};

class DistributedStrategy {
 public:
  virtual ~DistributedStrategy() = default;

  // All-reduces the number of target tokens this rank trains on in the current optimizer step
  // (all its micro-batches) and returns 1 / the global count. INVALID_ARGUMENT when that is 0.
  virtual absl::StatusOr<LossScale> ComputeLossScale(int64_t local_target_tokens) = 0;

  // `grad` is parameter `param_index`'s gradient from the current micro-batch (its shape). Call
  // once per parameter and micro-batch, in any order; parameters never reported count as zero.
  virtual absl::Status OnGradientReady(int param_index, const at::Tensor& grad) = 0;

  // The same for several parameters at once (param_indices[k]'s gradient is grads[k]): what
  // OnGradientReady does for each, in order; a strategy may do it in fewer launches.
  virtual absl::Status OnGradientsReady(const std::vector<int>& param_indices,
                                        const std::vector<at::Tensor>& grads);

  // For engines that let autograd accumulate into .grad(): reports every defined .grad() (last
  // parameter first, the order of backward) and resets it.
  absl::Status TakeGradsFromParams();

  // After each micro-batch's backward.
  virtual absl::Status EndMicroBatch() = 0;

  // At the accumulation boundary: reduce, clip by the global norm, AdamW with `lr`, write the
  // updated values into the parameters on every rank, clear the gradients. The work is queued
  // on the device; the report's gradient norm is read when asked (PendingStepReport::Get).
  virtual absl::StatusOr<PendingStepReport> QueueStep(double lr) = 0;
  // QueueStep with its report read at once.
  absl::StatusOr<StepReport> Step(double lr);

  virtual int64_t steps_taken() const = 0;
  virtual MemoryReport Memory() const = 0;
  virtual StrategyDescription Describe() const = 0;

  // At an accumulation boundary. Every rank writes its partition of the fp32 master weights and
  // AdamW state into `dir`; rank 0 then writes manifest.json, so a directory with a manifest is a
  // complete checkpoint.
  virtual absl::Status SaveCheckpoint(const std::string& dir) = 0;

  // Restores a checkpoint written with any world size and stage (re-partitioning as needed);
  // the parameters hold the restored weights afterwards.
  virtual absl::StatusOr<ResumeReport> LoadCheckpoint(const std::string& dir) = 0;

  // The fp32 master weights of every parameter, gathered (for the final adapter). Collective.
  virtual absl::StatusOr<std::vector<at::Tensor>> GatherMasterWeights() = 0;

  virtual const std::vector<TrainableParam>& params() const = 0;
};

// Stage 0, 1, 2 or 3. Collective: broadcasts rank 0's parameter values so that every rank
// starts from the same weights. `communicator` must outlive the strategy.
absl::StatusOr<std::unique_ptr<DistributedStrategy>> MakeStrategy(
    int stage, const StrategyOptions& options, comm::Communicator& communicator,
    std::vector<TrainableParam> params);

// How a stage keeps the model's frozen base weights, asked before the model is loaded (the
// loader hands each layer to where it is kept as it reads it): whole on every rank (stages
// 0-2), or cut into equal shards, one a rank, made whole by `all_gather` (stage 3).
struct BaseWeightPartition {
  bool partitioned = false;  // stage 3, at any world size (1: the one rank keeps it all)
  int rank = 0;
  int world_size = 1;
  // Every rank's shard (int64 [n], the same n on every rank) into full (int64 [world_size n],
  // rank r's at [r n, (r + 1) n)). A collective on the strategy's communicator; null when whole.
  std::function<absl::Status(const at::Tensor& shard, const at::Tensor& full)> all_gather;
};
// `communicator` must outlive the all-gather. InvalidArgument for a stage outside 0-3.
absl::StatusOr<BaseWeightPartition> PlanBaseWeights(int stage, const StrategyOptions& options,
                                                    comm::Communicator& communicator);

}  // namespace qlora::strategy
