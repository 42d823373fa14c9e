// ZeroStrategy: construction, the gradient path (accumulate, bucketed reduction) and the step.
// Checkpoints are in zero_checkpoint.cc.
#include "worker/strategy/zero_strategy.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/strategy/scalar_read.h"

namespace qlora::strategy {
namespace {

std::vector<int64_t> Numels(const std::vector<TrainableParam>& params) {
  std::vector<int64_t> numels;
  for (const TrainableParam& p : params) numels.push_back(p.tensor.defined() ? p.tensor.numel() : 0);
  return numels;
}

at::Tensor Slice(const at::Tensor& flat, FlatRange range, int64_t base = 0) {
  return flat.slice(0, range.begin - base, range.end - base);
}

// optim::ClipCoefficient of a float64 norm on its device, min(1, max_norm / (norm + 1e-6)) in
// the same float64 operations, as a one-element tensor.
at::Tensor ClipCoefficientOnDevice(const at::Tensor& norm, double max_norm) {
  return at::clamp_max(at::div(at::full({}, max_norm, norm.options()), norm.reshape({}) + 1e-6),
                       1.0);
}

}  // namespace

ZeroStrategy::ZeroStrategy(const ZeroPlan& plan, const StrategyOptions& options,
                           comm::Communicator& communicator, std::vector<TrainableParam> params)
    : plan_(plan),
      options_(options),
      comm_(communicator),
      params_(std::move(params)),
      layout_(Numels(params_), communicator.world_size()) {}

at::TensorOptions ZeroStrategy::Fp32() const {
  return at::TensorOptions().dtype(at::kFloat).device(params_.front().tensor.device());
}

FlatRange ZeroStrategy::Owned() const {
  return plan_.partition_optimizer ? layout_.Partition(comm_.rank())
                                   : FlatRange{0, layout_.padded_numel()};
}

void ZeroStrategy::NoteCommBuffer(int64_t bytes) {
  live_comm_bytes_ += bytes;
  peak_comm_bytes_ = std::max(peak_comm_bytes_, live_comm_bytes_);
}

absl::Status ZeroStrategy::Collective(const absl::Status& status) {
  if (!status.ok()) broken_ = status;
  return status;
}

absl::Status ZeroStrategy::Init() {
  if (params_.empty()) return absl::InvalidArgumentError("strategy: no trainable parameters");
  std::set<std::string> names;
  for (const TrainableParam& p : params_) {
    if (!p.tensor.defined() || !at::isFloatingType(p.tensor.scalar_type()) ||
        p.tensor.device() != params_.front().tensor.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "strategy: parameter '", p.name,
          "' must be a defined floating-point tensor on the first parameter's device"));
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("strategy: duplicate parameter '", p.name, "'"));
    }
  }
  if (options_.bucket_elements <= 0) {
    return absl::InvalidArgumentError("strategy: bucket_elements must be positive");
  }
  at::Tensor flat = at::zeros({layout_.padded_numel()}, Fp32());
  for (int i = 0; i < layout_.num_params(); ++i) {
    Slice(flat, layout_.Param(i)).copy_(params_[i].tensor.detach().reshape({-1}));
  }
  QLORA_RETURN_IF_ERROR(Collective(comm_.Broadcast(flat, 0, options_.collective_timeout)));
  const bool alias = std::all_of(params_.begin(), params_.end(), [](const TrainableParam& p) {
    return p.tensor.scalar_type() == at::kFloat;
  });
  for (int i = 0; i < layout_.num_params(); ++i) {
    const at::Tensor view = Slice(flat, layout_.Param(i)).view(params_[i].tensor.sizes());
    if (alias) {
      params_[i].tensor.set_data(view);  // the engine's handle now reads and writes `flat`
    } else {
      params_[i].tensor.detach().copy_(view);
    }
  }
  if (alias) {
    flat_ = flat;
    master_ = Slice(flat_, Owned());
  } else {
    master_ = Slice(flat, Owned()).clone();
  }
  adamw_ = std::make_unique<optim::AdamW>(options_.adamw, Owned().size(), Fp32(),
                                          options_.adamw_moments);
  grad_ = at::zeros({plan_.partition_gradients ? layout_.partition_numel() : layout_.padded_numel()},
                    Fp32());
  if (plan_.partition_gradients) PlanBuckets();
  return absl::OkStatus();
}

absl::StatusOr<LossScale> ZeroStrategy::ComputeLossScale(int64_t local_target_tokens) {
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  if (local_target_tokens < 0) {
    return absl::InvalidArgumentError("strategy: negative target-token count");
  }
  LossScale scale;
  scale.global_target_tokens = local_target_tokens;
  if (!Alone()) {  // one rank's count is the global one: no device round trip
    at::Tensor count = at::full({1}, static_cast<double>(local_target_tokens),
                                Fp32().dtype(at::kDouble));
    QLORA_RETURN_IF_ERROR(Collective(comm_.AllReduceSum(count, options_.collective_timeout)));
    scale.global_target_tokens = static_cast<int64_t>(count.item<double>());
  }
  if (scale.global_target_tokens == 0) {
    return absl::InvalidArgumentError("strategy: no rank has target tokens in this step");
  }
  scale.scale = 1.0 / static_cast<double>(scale.global_target_tokens);
  return scale;
}

void ZeroStrategy::PlanBuckets() {
  // Backward produces gradients roughly last parameter first, so buckets run from the end.
  bucket_of_param_.assign(layout_.num_params(), 0);
  for (int i = layout_.num_params() - 1; i >= 0; --i) {
    const int64_t n = layout_.Param(i).size();
    if (buckets_.empty() ||
        buckets_.back().range.size() + n > options_.bucket_elements) {
      Bucket b;
      b.last_param = i;
      b.range = {layout_.Param(i).end, layout_.Param(i).end};
      buckets_.push_back(b);
    }
    Bucket& b = buckets_.back();
    b.first_param = i;
    b.range.begin = layout_.Param(i).begin;
    ++b.pending;
    bucket_of_param_[i] = static_cast<int>(buckets_.size()) - 1;
  }
  reported_.assign(layout_.num_params(), false);
}

absl::Status ZeroStrategy::CheckGradient(int param_index, const at::Tensor& grad) const {
  if (param_index < 0 || param_index >= layout_.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("strategy: no parameter ", param_index));
  }
  if (!grad.defined() || grad.numel() != layout_.Param(param_index).size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "strategy: gradient of '", params_[param_index].name, "' has the wrong size"));
  }
  return absl::OkStatus();
}

absl::Status ZeroStrategy::OnGradientReady(int param_index, const at::Tensor& grad) {
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  QLORA_RETURN_IF_ERROR(CheckGradient(param_index, grad));
  const FlatRange range = layout_.Param(param_index);
  at::Tensor flat_grad = grad.detach().reshape({-1});
  if (!ReducesInBuckets()) {
    Slice(grad_, range).add_(flat_grad);
    return absl::OkStatus();
  }
  const int b = bucket_of_param_[param_index];
  Bucket& bucket = buckets_[b];
  if (b < next_bucket_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "strategy: gradient of '", params_[param_index].name,
        "' arrived after its bucket was reduced in this micro-batch"));
  }
  if (!bucket.staging.defined()) {
    bucket.staging = at::zeros({bucket.range.size()}, Fp32());
    NoteCommBuffer(bucket.staging.nbytes());
  }
  Slice(bucket.staging, range, bucket.range.begin).add_(flat_grad);
  if (!reported_[param_index]) {
    reported_[param_index] = true;
    --bucket.pending;
  }
  return LaunchReadyBuckets(/*flush=*/false);
}

absl::Status ZeroStrategy::OnGradientsReady(const std::vector<int>& param_indices,
                                            const std::vector<at::Tensor>& grads) {
  if (ReducesInBuckets() || param_indices.size() != grads.size()) {
    return DistributedStrategy::OnGradientsReady(param_indices, grads);
  }
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  // One multi-tensor add for all of them: the same sums as one add_ each, without a launch
  // (and host time longer than the add itself) per parameter.
  std::vector<at::Tensor> sums, addends;
  for (size_t k = 0; k < grads.size(); ++k) {
    QLORA_RETURN_IF_ERROR(CheckGradient(param_indices[k], grads[k]));
    sums.push_back(Slice(grad_, layout_.Param(param_indices[k])));
    addends.push_back(grads[k].detach().reshape({-1}));
  }
  at::_foreach_add_(sums, addends);
  return absl::OkStatus();
}

absl::Status ZeroStrategy::LaunchReadyBuckets(bool flush) {
  // Buckets are reduced strictly in order so that every rank issues the same collectives.
  const int rank = comm_.rank();
  const FlatRange mine = layout_.Partition(rank);
  while (next_bucket_ < static_cast<int>(buckets_.size())) {
    Bucket& bucket = buckets_[next_bucket_];
    if (bucket.pending > 0 && !flush) break;
    if (!bucket.staging.defined()) {
      bucket.staging = at::zeros({bucket.range.size()}, Fp32());
      NoteCommBuffer(bucket.staging.nbytes());
    }
    const std::vector<int64_t> counts = layout_.SplitByPartition(bucket.range);
    at::Tensor reduced = at::empty({counts[rank]}, Fp32());
    NoteCommBuffer(reduced.nbytes());
    QLORA_RETURN_IF_ERROR(Collective(comm_.ReduceScatterSum(bucket.staging, reduced, counts,
                                                            options_.collective_timeout)));
    const FlatRange own = Intersect(bucket.range, mine);
    if (own.size() > 0) Slice(grad_, own, mine.begin).add_(reduced);
    live_comm_bytes_ -= reduced.nbytes() + bucket.staging.nbytes();
    bucket.staging = at::Tensor();
    ++next_bucket_;
  }
  return absl::OkStatus();
}

absl::Status ZeroStrategy::EndMicroBatch() {
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  if (!ReducesInBuckets()) return absl::OkStatus();
  QLORA_RETURN_IF_ERROR(LaunchReadyBuckets(/*flush=*/true));
  next_bucket_ = 0;
  std::fill(reported_.begin(), reported_.end(), false);
  for (Bucket& b : buckets_) b.pending = b.last_param - b.first_param + 1;
  return absl::OkStatus();
}

absl::StatusOr<PendingStepReport> ZeroStrategy::QueueStep(double lr) {
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  if (ReducesInBuckets() &&
      std::any_of(reported_.begin(), reported_.end(), [](bool r) { return r; })) {
    QLORA_RETURN_IF_ERROR(EndMicroBatch());
  }
  const absl::Duration timeout = options_.collective_timeout;
  const bool alone = Alone();
  at::Tensor grad = grad_;  // this rank's owned gradient, Owned().size() elements
  if (!alone && !plan_.partition_optimizer) {
    for (int64_t begin = 0; begin < layout_.padded_numel(); begin += options_.bucket_elements) {
      const int64_t end = std::min(layout_.padded_numel(), begin + options_.bucket_elements);
      QLORA_RETURN_IF_ERROR(Collective(comm_.AllReduceSum(grad_.slice(0, begin, end), timeout)));
    }
  } else if (!alone && !plan_.partition_gradients) {
    grad = at::empty({layout_.partition_numel()}, Fp32());
    NoteCommBuffer(grad.nbytes());
    const std::vector<int64_t> counts(comm_.world_size(), layout_.partition_numel());
    QLORA_RETURN_IF_ERROR(Collective(comm_.ReduceScatterSum(grad_, grad, counts, timeout)));
  }
  // The L2 norm accumulated in float64 by one reduction (no float64 copy of the gradient).
  at::Tensor norm = at::linalg_vector_norm(grad, 2, std::nullopt, false, at::kDouble);
  if (plan_.partition_optimizer && !alone) {  // the partitions' squared norms, summed
    at::Tensor sum_sq = norm.square().reshape({1});
    QLORA_RETURN_IF_ERROR(Collective(comm_.AllReduceSum(sum_sq, timeout)));
    norm = sum_sq.sqrt();
  }
  // The norm reaches the host while the optimizer's kernels run: the clipping coefficient is
  // applied on the device (x 1 exactly when it is 1), and the report reads the norm when asked
  // (PendingStepReport::Get), so no read of it stalls the queue.
  ScalarRead norm_read(norm);
  // The coefficient multiplies the gradient inside the optimizer's pass (grad is zeroed next).
  adamw_->Step(lr, master_, grad,
               options_.max_grad_norm > 0 ? ClipCoefficientOnDevice(norm, options_.max_grad_norm)
                                          : at::Tensor());
  StepReport report;
  report.lr = lr;
  report.step = adamw_->step();
  if (!grad.is_same(grad_)) live_comm_bytes_ -= grad.nbytes();
  grad_.zero_();
  QLORA_RETURN_IF_ERROR(PublishMaster());
  return PendingStepReport(report, std::move(norm_read), options_.max_grad_norm);
}

absl::StatusOr<at::Tensor> ZeroStrategy::FullMaster() {
  if (flat_.defined()) return flat_;  // PublishMaster keeps it whole
  if (!plan_.partition_optimizer) return master_;
  at::Tensor full = at::empty({layout_.padded_numel()}, Fp32());
  NoteCommBuffer(full.nbytes());
  absl::Status gathered = Collective(comm_.AllGather(master_, full, options_.collective_timeout));
  live_comm_bytes_ -= full.nbytes();
  if (!gathered.ok()) return gathered;
  return full;
}

absl::Status ZeroStrategy::PublishMaster() {
  if (flat_.defined()) {
    // The parameters are `flat_`: only the other ranks' partitions need to arrive.
    if (!plan_.partition_optimizer || comm_.world_size() == 1) return absl::OkStatus();
    at::Tensor own = master_.clone();
    NoteCommBuffer(own.nbytes());
    absl::Status gathered = Collective(comm_.AllGather(own, flat_, options_.collective_timeout));
    live_comm_bytes_ -= own.nbytes();
    return gathered;
  }
  QLORA_ASSIGN_OR_RETURN(at::Tensor full, FullMaster());
  for (int i = 0; i < layout_.num_params(); ++i) {
    params_[i].tensor.detach().copy_(Slice(full, layout_.Param(i)).view(params_[i].tensor.sizes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<at::Tensor>> ZeroStrategy::GatherMasterWeights() {
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  QLORA_ASSIGN_OR_RETURN(at::Tensor full, FullMaster());
  std::vector<at::Tensor> weights;
  for (int i = 0; i < layout_.num_params(); ++i) {
    weights.push_back(Slice(full, layout_.Param(i)).view(params_[i].tensor.sizes()).clone());
  }
  return weights;
}

StrategyDescription ZeroStrategy::Describe() const {
  StrategyDescription d;
  d.stage = plan_.stage;
  d.world_size = comm_.world_size();
  d.trainable_elements = layout_.numel();
  d.partition_elements = Owned().size();
  d.partitions_optimizer_state = plan_.partition_optimizer;
  d.partitions_gradients = plan_.partition_gradients;
  d.partitions_base_weights = plan_.partition_base_weights;
  return d;
}

MemoryReport ZeroStrategy::Memory() const {
  MemoryReport m;
  m.master_bytes = static_cast<int64_t>(master_.nbytes());
  m.optimizer_bytes = adamw_->DeviceStateBytes();
  m.optimizer_host_bytes = adamw_->StateBytes() - m.optimizer_bytes;
  m.gradient_bytes = static_cast<int64_t>(grad_.nbytes());
  m.comm_buffer_bytes = peak_comm_bytes_;
  return m;
}

}  // namespace qlora::strategy
