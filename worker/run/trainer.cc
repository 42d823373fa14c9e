// Trainer: one rank's training run as phases (see trainer.h).
#include "worker/run/trainer.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/posix_files.h"
#include "common/status_macros.h"
#include "common/train_summary_text.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/export/gguf_export.h"
#include "worker/engine/adapter_copies.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/offload_rates.h"
#include "worker/engine/peft_io.h"
#include "common/model/llama_config.h"
#include "worker/memory/base_weight_plan.h"
#include "worker/memory/memory_budget.h"
#include "common/checkpoint_dirs.h"
#include "worker/memory/device_memory.h"
#include "worker/run/evaluation.h"
#include "worker/run/model_card.h"
#include "worker/run/generator_seeds.h"
#include "worker/run/job_hparams.h"
#include "worker/memory/host_memory.h"
#include "worker/run/rank_sums.h"
#include "worker/run/run_options.h"
#include "worker/run/training_objective.h"
#include "worker/run/training_observer.h"
#include "worker/strategy/scalar_read.h"
#ifdef QLORA_HAVE_NCCL
#include "worker/comm/nccl_communicator.h"
#endif

namespace qlora::worker {
namespace {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wraps a borrowed store for APIs that take shared ownership.
std::shared_ptr<comm::RendezvousStore> Borrow(comm::RendezvousStore* store) {
  return std::shared_ptr<comm::RendezvousStore>(store, [](comm::RendezvousStore*) {});
}

}  // namespace

Trainer::Trainer(const TrainingContext& context)
    : context_(context),
      config_(context.config),
      assignment_(context.assignment),
      device_(context.assignment.device == DeviceKind::kCuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU)),
      eval_loss_(NAN) {}

void Trainer::Log(const std::string& line) const {
  fprintf(stderr, "[rank %d] %s\n", assignment_.rank, line.c_str());
  fflush(stderr);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainingContext& context) {
  std::unique_ptr<Trainer> trainer(new Trainer(context));
  QLORA_RETURN_IF_ERROR(trainer->Connect());
  QLORA_RETURN_IF_ERROR(trainer->LoadModel());
  QLORA_RETURN_IF_ERROR(trainer->BuildStrategy());
  QLORA_RETURN_IF_ERROR(trainer->ChooseCheckpointing());
  QLORA_RETURN_IF_ERROR(trainer->OpenData());
  QLORA_RETURN_IF_ERROR(trainer->PlanSchedule());
  return trainer;
}

absl::Status Trainer::Connect() {
  const WorkerAssignment& a = assignment_;
  const std::string prefix = absl::StrCat(a.job_id, "/gen-", a.generation);
#ifdef QLORA_HAVE_NCCL
  if (device_.is_cuda()) {
    comm::NcclOptions o;
    o.rank = a.rank;
    o.world_size = a.world_size;
    o.device = 0;
    o.unique_id = a.nccl_unique_id;
    o.store = Borrow(context_.store);
    o.prefix = prefix;
    QLORA_ASSIGN_OR_RETURN(communicator_, comm::ConnectNccl(o));
    Log(absl::StrCat("joined ", a.world_size, " ranks over NCCL"));
    return absl::OkStatus();
  }
#endif
  comm::GlooOptions o;
  o.rank = a.rank;
  o.world_size = a.world_size;
  o.prefix = prefix;
  o.hostname = context_.gloo_hostname;
  o.iface = context_.gloo_iface;
  QLORA_ASSIGN_OR_RETURN(communicator_, comm::ConnectGloo(o, Borrow(context_.store)));
  Log(absl::StrCat("joined ", a.world_size, " ranks over Gloo"));
  return absl::OkStatus();
}

int64_t Trainer::ActivationHostBytes() const {
  // trainer.max_host_memory_gib, else half of what the host has left (the rest for the data,
  // the checkpoints and the host's own), shared with the other ranks, which may all run on this
  // host (local workers do).
  return memory::HostBudgetBytes(
      config_.trainer, memory::HostAvailableBytes() / (2 * std::max(assignment_.world_size, 1)));
}

absl::Status Trainer::PlanBaseWeightPlacement() {
  StrategyConfig& s = config_.backend.strategy;
  if (!s.zero_stage_auto) return absl::OkStatus();
  QLORA_ASSIGN_OR_RETURN(const engine::LlamaConfig model,
                         engine::LoadLlamaConfig(config_.base_model_path));
  memory::BaseWeightPlanRequest r;
  r.activations = memory::ActivationRequestFor(config_, model, device_.is_cuda());
  r.quantization = config_.quantization;
  r.world_size = assignment_.world_size;
  r.input_embedding_on_host = device_.is_cuda();  // as LoadModel loads it
  r.adamw_moments_on_host = device_.is_cuda() && s.offload_optimizer;
  const TrainerConfig& t = config_.trainer;
  r.mlp_tiles = memory::CheckpointingBudget::MayTileMlps(t, device_);
  // Every rank plans for the smallest device and host budgets of all, so that all choose the
  // same stage.
  const int64_t own_budget =
      memory::MemoryBudgetBytes(t, memory::DeviceAvailableBytes(device_));
  const int64_t own_host =
      memory::CheckpointingBudget::UsesOffloadRates(t, device_) ? ActivationHostBytes() : 0;
  const int64_t world = communicator_->world_size();
  const at::Tensor budgets = at::empty({world, 2}, at::dtype(at::kLong).device(device_));
  const at::Tensor own =
      at::tensor(std::vector<int64_t>{own_budget, own_host}, at::dtype(at::kLong)).to(device_);
  QLORA_RETURN_IF_ERROR(communicator_->AllGather(own, budgets, absl::Minutes(5)));
  const at::Tensor smallest = std::get<0>(budgets.min(0)).cpu();
  r.budget_bytes = smallest[0].item<int64_t>();
  r.activation_host_bytes = smallest[1].item<int64_t>();
  const memory::BaseWeightPlan plan = memory::PlanBaseWeights(r);
  Log(absl::StrCat("memory plan: ", plan.reason));
  if (plan.budget_bytes <= 0) return absl::OkStatus();  // nothing to plan for: as parsed
  s.zero_stage = plan.zero_stage;
  s.offload_param = plan.offload_param;
  s.zero_stage_reason = absl::StrCat("planned by the workers: ", plan.reason);
  return absl::OkStatus();
}

absl::Status Trainer::LoadModel() {
  engine::UseMmapForLargeHostAllocations();  // host memory stays near one tensor while loading
  if (IsPreferenceJob(config_) && config_.lora.dropout > 0) {
    // TRL's preference trainers disable dropout (disable_dropout, on by default): a policy
    // with dropout would differ from its reference by noise alone. Before the memory plans,
    // which count dropout's masks.
    Log(absl::StrFormat("adapter.dropout %g is off for %s, as TRL's disable_dropout has it",
                        config_.lora.dropout, EnumName(config_.trainer.type)));
    config_.lora.dropout = 0;
  }
  const double start = SteadySeconds();
  const int64_t cap = memory::CapDeviceMemory(
      device_, memory::MemoryBudgetBytes(config_.trainer, /*available_bytes=*/0));
  if (cap > 0) Log(absl::StrCat("device memory capped at ", memory::FormatMemory(cap), " (trainer.max_memory_gib)"));
  QLORA_RETURN_IF_ERROR(PlanBaseWeightPlacement());
  engine::LoadOptions load = LoadOptionsFor(config_, device_);
  // Training reads the input embedding's rows once a micro-batch, from ids the host has anyway:
  // its table waits in host memory (untied models), exact, and the device keeps its bytes.
  load.input_embedding_in_host_memory = true;
  QLORA_ASSIGN_OR_RETURN(load.base_weights, MakeBaseWeightStore());
  QLORA_ASSIGN_OR_RETURN(model_, engine::LoadLlama(config_.base_model_path, load));
  if (load.base_weights != nullptr) Log(load.base_weights->Describe());
  if (model_->InputEmbeddingOnHost()) {
    Log(absl::StrCat("input embedding table in pinned host memory (",
                     memory::FormatMemory(model_->embed_tokens.nbytes()),
                     " less on the device); its rows are gathered there a micro-batch at a time"));
  }
  const QuantizationConfig& q = config_.quantization;
  Log(absl::StrFormat("loaded %s (%d layers, %s) in %.1fs", config_.base_model_path,
                      model_->config().num_hidden_layers, q.enabled ? EnumName(q.quant_type) : "unquantized",
                      SteadySeconds() - start));
  QLORA_RETURN_IF_ERROR(model_->AddLora(LoraOptionsFor(config_)));
  if (!config_.lora.pretrained_adapter_path.empty()) QLORA_RETURN_IF_ERROR(StartFromAdapter());
  QLORA_ASSIGN_OR_RETURN(objective_, MakeObjective(config_, *model_));  // its reference: the adapters as loaded
  model_->SetTraining(true);  // every layer checkpointed until ChooseCheckpointing
  if (context_.observer != nullptr) context_.observer->OnLoraReady(*model_);
  return absl::OkStatus();
}

absl::Status Trainer::StartFromAdapter() {
  const std::string& dir = config_.lora.pretrained_adapter_path;
  QLORA_ASSIGN_OR_RETURN(const engine::LoraOptions saved, engine::ReadAdapterConfig(dir));
  const engine::LoraOptions job = LoraOptionsFor(config_);
  const std::set<std::string> saved_targets(saved.target_modules.begin(), saved.target_modules.end());
  const std::set<std::string> job_targets(job.target_modules.begin(), job.target_modules.end());
  if (saved.r != job.r || saved.alpha != job.alpha || saved.use_rslora != job.use_rslora ||
      saved_targets != job_targets) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "adapter.pretrained_adapter_weights: %s has r %d, alpha %g, use_rslora %s, "
        "target_modules [%s]; the job has r %d, alpha %g, use_rslora %s, target_modules [%s]: "
        "write the adapter's values in the job file",
        dir, saved.r, saved.alpha, saved.use_rslora ? "true" : "false",
        absl::StrJoin(saved_targets, ", "), job.r, job.alpha, job.use_rslora ? "true" : "false",
        absl::StrJoin(job_targets, ", ")));
  }
  QLORA_RETURN_IF_ERROR(engine::LoadAdapterWeights(model_.get(), dir));
  Log(absl::StrCat("adapters start from ", dir));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<engine::BaseWeightStore>> Trainer::MakeBaseWeightStore() {
  QLORA_ASSIGN_OR_RETURN(
      const strategy::BaseWeightPartition partition,
      strategy::PlanBaseWeights(config_.backend.strategy.zero_stage, StrategyOptionsFor(config_),
                                *communicator_));
  const StrategyConfig& s = config_.backend.strategy;
  if (!partition.partitioned && !s.offload_param) {
    return std::shared_ptr<engine::BaseWeightStore>();  // every layer whole on the device
  }
  engine::BaseWeightStoreOptions o;
  o.device = device_;
  o.rank = partition.rank;
  o.world_size = partition.world_size;
  o.all_gather = partition.all_gather;
  o.on_host = s.offload_param;
  o.pin_memory = s.offload_param_pin_memory;
  return std::make_shared<engine::BaseWeightStore>(std::move(o));
}

absl::Status Trainer::BuildStrategy() {
  for (auto& [name, tensor] : model_->TrainableParameters()) params_.push_back({name, tensor});
  QLORA_ASSIGN_OR_RETURN(strategy_, strategy::MakeStrategy(config_.backend.strategy.zero_stage,
                                                           StrategyOptionsFor(config_),
                                                           *communicator_, params_));
  const strategy::StrategyDescription d = strategy_->Describe();
  const int64_t host_moments = strategy_->Memory().optimizer_host_bytes;
  Log(absl::StrFormat("ZeRO stage %d over %d rank(s): %d trainable elements, %d kept here%s%s%s",
                      d.stage, d.world_size, d.trainable_elements, d.partition_elements,
                      d.partitions_optimizer_state ? ", optimizer state partitioned" : "",
                      d.partitions_gradients ? ", gradients partitioned" : "",
                      host_moments > 0 ? absl::StrFormat(", AdamW moments in host memory "
                                                         "(%.1f MiB, offload_optimizer)",
                                                         host_moments / 1048576.0)
                                       : std::string()));
  return absl::OkStatus();
}

absl::Status Trainer::ChooseCheckpointing() {
  memory::CheckpointingBudgetOptions o;
  o.config = &config_;
  o.model = model_.get();
  o.device = device_;
  const TrainerConfig& t = config_.trainer;
  if (memory::CheckpointingBudget::UsesOffloadRates(t, device_)) {
    engine::OffloadRateOptions rates;
    rates.device = device_;
    rates.model = model_->config();
    rates.tokens = int64_t{RowsPerMicroBatch(config_)} * config_.data.max_sequence_length;
    rates.dtype = model_->compute_dtype();
    rates.host_bytes = ActivationHostBytes();
    o.offload_rates = engine::MeasureOffloadRates(rates);  // before the peak below is read
  }
  o.trainable_elements = strategy_->Describe().trainable_elements;
  o.strategy_bytes = strategy_->Memory().total();
  o.available_bytes = memory::DeviceAvailableBytes(device_);
  o.allocated_bytes = memory::DeviceAllocatedBytes(device_);
  o.peak_bytes = device_.is_cuda() ? memory::PeakMemoryBytes(device_) : 0;
  QLORA_ASSIGN_OR_RETURN(memory::CheckpointingBudget budget, memory::CheckpointingBudget::Start(o));
  checkpointing_ = std::move(budget);
  Log(checkpointing_->Describe());
  memory::DequantizedWeightsOptions d;
  d.trainer = &t;
  d.model = model_.get();
  d.device = device_;
  d.available_bytes = o.available_bytes;
  std::string line;
  dequantized_ = memory::DequantizedWeights::Start(d, &line);
  if (!line.empty()) Log(line);
  return absl::OkStatus();
}

CheckpointingReport Trainer::checkpointing() const {
  CheckpointingReport report = checkpointing_->Report();
  report.dequantized_layers = model_->dequantized_layers();
  return report;
}

absl::Status Trainer::OpenData() {
  const WorkerAssignment& a = assignment_;
  MicroBatchOptions options;
  options.config = &config_;
  options.model_dir = config_.base_model_path;
  options.device = device_;
  options.rank = a.rank;
  options.role = data::DatasetRole::kTrain;
  QLORA_ASSIGN_OR_RETURN(train_, MicroBatchSource::Open(a.train_shards, options));
  // Validation: its own file's shards, or the validation fraction of the train shards.
  const bool split_train = a.validation_shards.empty() && config_.data.validation_fraction > 0;
  if (!a.validation_shards.empty() || split_train) {
    options.role = data::DatasetRole::kValidation;
    QLORA_ASSIGN_OR_RETURN(validation_,
                           MicroBatchSource::Open(split_train ? a.train_shards : a.validation_shards, options));
  }
  return absl::OkStatus();
}

absl::Status Trainer::PlanSchedule() {
  const TrainerConfig& t = config_.trainer;
  QLORA_ASSIGN_OR_RETURN(StepBatches steps, StepBatches::Start(train_.get(), communicator_.get(), device_,
                                                               t.gradient_accumulation_steps, t.batch_size));
  steps_ = std::make_unique<StepBatches>(std::move(steps));
  const int64_t per_epoch = steps_->steps_per_first_epoch();
  total_steps_ = t.train_steps > 0 ? t.train_steps : per_epoch * t.epochs;
  schedule_ = LrScheduleFor(config_, total_steps_);
  Log(absl::StrFormat("%d optimizer steps (%d per epoch), %d micro-batches of %d per step", total_steps_,
                      per_epoch, t.gradient_accumulation_steps, t.batch_size));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Trainer::Resume() {
  run_started_ = SteadySeconds();
  // The job's own checkpoints first: a restart of a continued job resumes from its own progress.
  std::string latest = LatestCheckpoint(CheckpointsDir(assignment_.output_dir, assignment_.job_id, assignment_.job_uid));
  if (latest.empty()) latest = config_.trainer.resume_from_checkpoint;
  if (latest.empty()) return 0;
  QLORA_ASSIGN_OR_RETURN(strategy::ResumeReport resumed, strategy_->LoadCheckpoint(latest));
  Log(absl::StrCat("resumed from ", latest, ": ", resumed.description));
  totals_.last_step = resumed.step;
  QLORA_RETURN_IF_ERROR(steps_->Skip(resumed.step));  // the data order up to the resumed step
  return resumed.step;
}

absl::StatusOr<StepResult> Trainer::Step(int64_t step) {
  QLORA_ASSIGN_OR_RETURN(QueuedStep queued, QueueStep(step));
  return Resolve(queued);
}

absl::StatusOr<Trainer::QueuedStep> Trainer::QueueStep(int64_t step) {
  // Named ranges for a profiler (step_profiler.h): each costs a flag test when none runs.
  RECORD_USER_SCOPE("qlora::step");
  QueuedStep queued;
  queued.start = SteadySeconds();
  if (started_ == 0) started_ = last_checkpoint_ = queued.start;
  SeedGeneratorsForStep(device_, config_.trainer.seed, assignment_.rank, step);
  QLORA_ASSIGN_OR_RETURN(std::vector<DeviceBatch> batches, steps_->Next());
  StepResult& result = queued.result;
  result.step = step + 1;
  result.epoch = steps_->epoch();
  result.epoch_finished = steps_->epoch_finished();
  result.epoch_records = steps_->epoch_records();
  result.total_records = steps_->total_records();
  int64_t local_units = 0;
  for (const DeviceBatch& b : batches) {
    local_units += objective_->LossUnits(b);
    result.local_input_tokens += b.input_tokens;
    queued.local_rows += b.input_ids.size(0);
  }
  queued.local_micro_batches = static_cast<int64_t>(batches.size());
  // The mean over the global batch: every rank's losses divided by all ranks' units (target
  // tokens, or micro-batches for preference tuning: training_objective.h).
  QLORA_ASSIGN_OR_RETURN(strategy::LossScale scale, strategy_->ComputeLossScale(local_units));
  // Before the adapter-copy scope: preference tuning's reference forwards swap the adapters out.
  QLORA_RETURN_IF_ERROR(objective_->BeforeStep(*model_, batches));
  // Summed on the device and copied to the host once it is final, after the last micro-batch's
  // loss: read at the step's end, it waits for that copy only, and the GPU is still busy with
  // the backward and the optimizer while the host queues the next step.
  at::Tensor local_loss_sum, local_metrics;
  {
    // The adapters cast to the compute dtype once for all of this step's micro-batches; the
    // copies go stale (the scope ends) before the optimizer changes the adapters.
    const engine::AdapterCopyScope adapter_copies(model_->adapter_copies());
    for (size_t i = 0; i < batches.size(); ++i) {
      const DeviceBatch& b = batches[i];
      if (context_.observer != nullptr) context_.observer->OnMicroBatch(step, static_cast<int>(i), b);
      // The gradient backward brings to loss_sum (1 when no rank has anything to learn).
      MicroBatchLoss loss = objective_->Loss(*model_, b, static_cast<int>(i), scale.scale != 0 ? scale.scale : 1.0);
      const at::Tensor sum = loss.loss_sum.detach().to(at::kDouble);
      local_loss_sum = local_loss_sum.defined() ? local_loss_sum + sum : sum;
      if (loss.metrics.defined()) local_metrics = local_metrics.defined() ? local_metrics + loss.metrics : loss.metrics;
      if (i + 1 == batches.size()) {
        queued.local_loss = strategy::ScalarRead(local_loss_sum);
        if (local_metrics.defined()) queued.local_metrics = strategy::ScalarRead(local_metrics);
      }
      const at::Tensor scaled_loss = loss.loss_sum * scale.scale;
      {
        RECORD_USER_SCOPE("qlora::backward");
        scaled_loss.backward();
      }
      {
        RECORD_USER_SCOPE("qlora::grads");
        QLORA_RETURN_IF_ERROR(strategy_->TakeGradsFromParams());
        QLORA_RETURN_IF_ERROR(strategy_->EndMicroBatch());
      }
    }
  }
  const double lr = optim::LearningRate(schedule_, strategy_->steps_taken());
  {
    RECORD_USER_SCOPE("qlora::optimizer");
    QLORA_ASSIGN_OR_RETURN(queued.report, strategy_->QueueStep(lr));
  }
  // Rank 0's clock decides a time-based checkpoint for every rank; the flag rides on the loss's
  // all-reduce (Resolve), so it costs no collective of its own.
  const double every_s = 60 * config_.trainer.checkpoint_every_minutes;
  queued.due_here = assignment_.rank == 0 && every_s > 0 && SteadySeconds() - last_checkpoint_ >= every_s;
  queued.loss_scale = scale.scale;
  result.global_loss_units = scale.global_target_tokens;
  queued.queued = SteadySeconds();
  return queued;
}

absl::StatusOr<StepResult> Trainer::Resolve(const QueuedStep& queued) {
  StepResult result = queued.result;
  result.report = queued.report.Get();
  const double local_loss = queued.local_loss.Get();
  std::vector<double> local = {local_loss, queued.due_here ? 1.0 : 0.0,
                               static_cast<double>(result.local_input_tokens),
                               static_cast<double>(queued.local_rows),
                               static_cast<double>(queued.local_micro_batches)};
  const std::vector<std::string> metric_names = objective_->MetricNames();
  std::vector<double> metrics = queued.local_metrics.Values();
  metrics.resize(metric_names.size(), 0.0);  // none: a rank without micro-batches
  local.insert(local.end(), metrics.begin(), metrics.end());
  QLORA_ASSIGN_OR_RETURN(std::vector<double> global, SumOverRanks(*communicator_, local, device_));
  result.loss = global[0] * queued.loss_scale;
  result.checkpoint_due = global[1] > 0;
  result.global_input_tokens = static_cast<int64_t>(global[2]);
  result.global_rows = static_cast<int64_t>(global[3]);
  // TRL's metrics: each micro-batch's, averaged over every rank's micro-batches of the step.
  for (size_t i = 0; i < metric_names.size() && global[4] > 0; ++i) {
    result.metrics.emplace_back(metric_names[i], global[5 + i] / global[4]);
  }
  // Its values were ready once read on a GPU (the reads wait for its work), when it was queued on
  // a CPU (which did the work then); its time runs from the later of its start and the previous
  // step's values: the device's time for it when the host ran ahead.
  const double ready = device_.is_cuda() ? SteadySeconds() : queued.queued;
  result.seconds = ready - std::max(queued.start, last_ready_);
  last_ready_ = ready;
  totals_.steps += 1;
  if (device_.is_cuda()) {
    MemorySnapshot allocator;  // one read of the allocator's statistics for both peaks
    memory::FillDeviceMemory(device_, &allocator);
    const int64_t peak = allocator.device_peak_bytes;
    // Held layers first: a re-plan below may change what is offloaded.
    std::string held;
    const int64_t held_bytes = dequantized_->AfterStep(
        totals_.steps, {peak, allocator.device_reserved_peak_bytes},
        checkpointing_->OffloadedLayerBytes(), checkpointing_->RoomForFixedBytes(peak), &held);
    const std::string measured = checkpointing_->AfterStep(totals_.steps, peak);
    if (!measured.empty()) Log(measured);
    checkpointing_->AddFixedBytes(held_bytes);
    if (!held.empty()) Log(held);
  }
  totals_.last_step = result.step;
  totals_.loss_sum += result.loss;
  totals_.last_loss = result.loss;
  totals_.tokens += result.global_input_tokens;
  totals_.samples += result.global_rows;
  return result;
}

absl::Status Trainer::After(const StepResult& result) {
  const TrainerConfig& t = config_.trainer;
  const int64_t done = result.step;
  bool evaluated = false;
  if (validation_ && t.eval_steps > 0 && done % t.eval_steps == 0) {
    QLORA_ASSIGN_OR_RETURN(const EvalOutcome outcome, objective_->Evaluate(*model_, *validation_, *communicator_));
    NoteEvalLoss(outcome.loss);
    eval_metrics_ = outcome.metrics;
    evaluated = true;
  }
  if (t.eval_steps > 0 && done % t.eval_steps == 0) QLORA_RETURN_IF_ERROR(GenerateSamples(done));
  const bool by_steps = t.steps_per_checkpoint > 0 && done % t.steps_per_checkpoint == 0;
  if ((by_steps || result.checkpoint_due) && done < total_steps_) {
    last_checkpoint_ = SteadySeconds();
    const std::string dir = CheckpointDir(CheckpointsDir(assignment_.output_dir, assignment_.job_id, assignment_.job_uid), done);
    if (context_.observer != nullptr) context_.observer->OnCheckpointSave(done, dir);
    QLORA_RETURN_IF_ERROR(strategy_->SaveCheckpoint(dir));  // complete on every rank once it returns
    // Beside the ZeRO shards (for an exact resume): the adapter as peft loads it.
    QLORA_RETURN_IF_ERROR(WriteAdapter(JoinPath(dir, kCheckpointAdapterDir)));
    Log(absl::StrCat("checkpoint ", dir));
    if (assignment_.rank == 0) {
      QLORA_RETURN_IF_ERROR(PruneCheckpoints(
          CheckpointsDir(assignment_.output_dir, assignment_.job_id, assignment_.job_uid),
          static_cast<int>(t.keep_checkpoints)));
    }
  }
  ProgressSnapshot p = Progress(result);
  if (evaluated) {
    for (const auto& [name, value] : eval_metrics_) p.metrics.emplace_back("eval_" + name, value);
  }
  context_.report_progress(p);
  if (result.epoch_finished) {
    const RecordCounts& r = p.epoch_records;
    Log(absl::StrFormat("epoch %d: trained %d records, %d left over (beyond the shortest rank's "
                        "steps), %d malformed skipped, %d without a target",
                        p.epoch, r.trained, r.left_over, r.malformed, r.without_target));
  }
  if (assignment_.rank == 0) {
    Log(absl::StrFormat("step %d/%d loss %.4f lr %.3g grad-norm %.3f tok/s %.0f", done, total_steps_, p.loss,
                        result.report.lr, result.report.grad_norm, p.tokens_per_second));
    RecordMetrics(result, p, evaluated);
    RecordSamples(done);
  }
  return absl::OkStatus();
}

absl::Status Trainer::GenerateSamples(int64_t step) {
  if (!sampler_made_) {
    sampler_made_ = true;
    QLORA_ASSIGN_OR_RETURN(sampler_, EvalSampler::ForJob(config_));
  }
  if (sampler_ == nullptr) return absl::OkStatus();
  QLORA_ASSIGN_OR_RETURN(samples_, sampler_->Generate(*model_));
  samples_step_ = step;
  return absl::OkStatus();
}

void Trainer::RecordSamples(int64_t step) {
  if (samples_.empty() || samples_step_ != step) return;
  for (size_t i = 0; i < samples_.size(); ++i) {
    Log(absl::StrCat("sample ", i + 1, " at step ", step, ": ",
                     absl::CHexEscape(samples_[i].output.substr(0, 200))));
  }
  if (metrics_ != nullptr) {
    if (absl::Status s = metrics_->RecordSamples(step, absl::ToUnixMicros(absl::Now()) / 1e6, samples_); !s.ok()) {
      Log(absl::StrCat("metrics: samples not recorded: ", s.message()));
    }
  }
  samples_.clear();
}

std::shared_ptr<tracking::MlflowReporter> Trainer::StartMlflow(const std::vector<tensorboard::HParam>& hparams) {
  absl::StatusOr<tracking::MlflowSettings> settings = tracking::MlflowSettingsFromEnvironment();
  if (!settings.ok()) {
    Log(absl::StrCat("WARNING: not reporting to MLflow: ", settings.status().message()));
    return nullptr;
  }
  tracking::MlflowReporterOptions options;
  options.settings = *settings;
  options.run_name = config_.name.empty() ? assignment_.job_id : config_.name;
  options.tags = {{"qlora.job_id", assignment_.job_id}, {"qlora.base_model", config_.base_model}};
  for (const tensorboard::HParam& h : hparams) {
    std::string value;
    if (const double* d = std::get_if<double>(&h.value)) value = absl::StrCat(*d);
    if (const bool* b = std::get_if<bool>(&h.value)) value = *b ? "true" : "false";
    if (const std::string* text = std::get_if<std::string>(&h.value)) value = *text;
    options.params.emplace_back(h.name, value);
  }
  options.finish_wait = absl::Seconds(15);
  // Said in the log and, with the next progress report, as a WORKER_NOTICE event of the job.
  options.warn = [this](const std::string& line) {
    Log(absl::StrCat("WARNING: ", line));
    absl::MutexLock lock(&notices_mu_);
    notices_.push_back(line);
  };
  Log(absl::StrCat("reporting to MLflow at ", settings->tracking_uri, ", experiment ",
                   settings->experiment_name));
  return std::make_shared<tracking::MlflowReporter>(std::move(options));
}

void Trainer::RecordMetrics(const StepResult& result, const ProgressSnapshot& p, bool evaluated) {
  if (metrics_failed_) return;
  const double now = absl::ToUnixMicros(absl::Now()) / 1e6;
  if (metrics_ == nullptr) {
    RunMetricsOptions options;
    options.output_dir = assignment_.output_dir;
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    options.host = host;
    options.pid = getpid();
    options.wall_time = now;
    options.hparams = JobHParams(config_, assignment_.world_size);
    options.hparam_metrics = JobHParamMetrics();
    if (config_.trainer.report_to_mlflow) options.mlflow = StartMlflow(options.hparams);
    absl::StatusOr<std::unique_ptr<RunMetrics>> opened = RunMetrics::Open(options);
    if (!opened.ok()) {
      metrics_failed_ = true;
      Log(absl::StrCat("metrics are off for this run: ", opened.status().message()));
      return;
    }
    metrics_ = std::move(*opened);
    Log(absl::StrCat("TensorBoard events: ", metrics_->event_file()));
  }
  StepMetrics m;
  m.step = result.step;
  m.epoch = p.epoch;
  m.loss = p.loss;
  m.learning_rate = result.report.lr;
  m.grad_norm = result.report.grad_norm;
  m.tokens_per_second = p.tokens_per_second;
  if (evaluated) m.eval_loss = eval_loss_;
  m.metrics = result.metrics;
  if (evaluated) m.eval_metrics = eval_metrics_;
  m.device_allocated_bytes = p.memory.device_allocated_bytes;
  m.device_peak_bytes = p.memory.device_peak_bytes;
  m.elapsed_seconds = p.elapsed_seconds;
  m.wall_time = now;
  if (absl::Status s = metrics_->Record(m); !s.ok()) {
    metrics_failed_ = true;
    metrics_.reset();
    Log(absl::StrCat("metrics are off for this run: ", s.message()));
  }
}

void Trainer::RecordFinalEvaluation() {
  if (metrics_ == nullptr || std::isnan(eval_loss_)) return;
  if (absl::Status s = metrics_->RecordEvaluation(total_steps_, absl::ToUnixMicros(absl::Now()) / 1e6, eval_loss_,
                                                  eval_metrics_);
      !s.ok()) {
    metrics_failed_ = true;
    metrics_.reset();
    Log(absl::StrCat("metrics are off for this run: ", s.message()));
  }
}

ProgressSnapshot Trainer::Progress(const StepResult& result) {
  ProgressSnapshot p;
  p.rank = assignment_.rank;
  p.step = result.step;
  p.total_steps = total_steps_;
  p.epoch = result.epoch;
  p.loss = result.loss;
  p.learning_rate = result.report.lr;
  p.tokens_per_second = result.seconds > 0 ? static_cast<double>(result.local_input_tokens) / result.seconds : 0;
  p.eval_loss = eval_loss_;
  p.elapsed_seconds = SteadySeconds() - started_;
  const strategy::MemoryReport m = strategy_->Memory();
  p.memory.master_weight_bytes = m.master_bytes;
  p.memory.optimizer_state_bytes = m.optimizer_bytes;
  p.memory.gradient_bytes = m.gradient_bytes;
  p.memory.comm_buffer_bytes = m.comm_buffer_bytes;
  memory::FillDeviceMemory(device_, &p.memory);
  const strategy::StrategyDescription d = strategy_->Describe();
  p.strategy.zero_stage = d.stage;
  p.strategy.world_size = d.world_size;
  p.strategy.trainable_elements = d.trainable_elements;
  p.strategy.partition_elements = d.partition_elements;
  p.strategy.partitioned_optimizer = d.partitions_optimizer_state;
  p.strategy.partitioned_gradients = d.partitions_gradients;
  if (const engine::BaseWeightStore* store = model_->base_weight_store()) {
    // The step's share of the store's running totals.
    const engine::BaseWeightStats now = store->stats();
    p.strategy.partitioned_base_weights = d.partitions_base_weights;
    p.strategy.base_weights_in_host_memory = store->on_host();
    p.strategy.base_weight_gathered_bytes = now.gathered_bytes - reported_base_stats_.gathered_bytes;
    p.strategy.base_weight_copied_bytes = now.copied_bytes - reported_base_stats_.copied_bytes;
    p.strategy.base_weight_wait_seconds = now.waited_seconds - reported_base_stats_.waited_seconds;
    reported_base_stats_ = now;
  }
  p.epoch_records = result.epoch_records;
  p.total_records = result.total_records;
  p.metrics = result.metrics;
  p.checkpointing = checkpointing();
  {
    absl::MutexLock lock(&notices_mu_);
    p.notices.swap(notices_);
  }
  return p;
}

void Trainer::NoteEvalLoss(double loss) {
  eval_loss_ = loss;
  if (std::isnan(totals_.best_eval_loss) || loss < totals_.best_eval_loss) totals_.best_eval_loss = loss;
}

absl::Status Trainer::WriteAdapter(const std::string& dir) {
  QLORA_ASSIGN_OR_RETURN(std::vector<at::Tensor> weights, strategy_->GatherMasterWeights());
  {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].tensor.copy_(weights[i]);
  }
  if (assignment_.rank != 0) return absl::OkStatus();
  engine::AdapterSaveOptions save;
  save.base_model_name_or_path = AdapterBaseModelName(config_);
  return engine::SaveAdapter(*model_, dir, save);
}

absl::StatusOr<TrainSummary> Trainer::Summarize() {
  // The largest peak over ranks: each rank fills its own slot of a sum.
  std::vector<double> peaks(static_cast<size_t>(assignment_.world_size), 0.0);
  peaks[static_cast<size_t>(assignment_.rank)] = static_cast<double>(memory::PeakMemoryBytes(device_));
  QLORA_ASSIGN_OR_RETURN(peaks, SumOverRanks(*communicator_, peaks, device_));
  TrainSummary s;
  const double began = run_started_ > 0 ? run_started_ : started_;
  s.train_runtime_seconds = began > 0 ? SteadySeconds() - began : 0;
  s.steps = totals_.steps;
  s.global_step = totals_.last_step;
  s.train_loss = totals_.steps > 0 ? totals_.loss_sum / static_cast<double>(totals_.steps) : NAN;
  s.final_train_loss = totals_.last_loss;
  s.samples = totals_.samples;
  s.tokens = totals_.tokens;
  if (s.train_runtime_seconds > 0) {
    s.train_samples_per_second = static_cast<double>(s.samples) / s.train_runtime_seconds;
    s.train_steps_per_second = static_cast<double>(s.steps) / s.train_runtime_seconds;
    s.tokens_per_second = static_cast<double>(s.tokens) / s.train_runtime_seconds;
  }
  for (double peak : peaks) s.peak_memory_bytes = std::max(s.peak_memory_bytes, static_cast<int64_t>(peak));
  s.eval_loss = eval_loss_;
  s.best_eval_loss = totals_.best_eval_loss;
  return s;
}

absl::StatusOr<TrainingOutcome> Trainer::Finish() {
  const int64_t eval_steps = config_.trainer.eval_steps;
  // The last step's evaluation (and its samples) already ran when it fell on eval_steps.
  const bool evaluated_last_step = eval_steps > 0 && total_steps_ % eval_steps == 0;
  if (validation_ && !evaluated_last_step) {
    QLORA_ASSIGN_OR_RETURN(const EvalOutcome outcome, objective_->Evaluate(*model_, *validation_, *communicator_));
    NoteEvalLoss(outcome.loss);
    eval_metrics_ = outcome.metrics;
    std::string metrics;
    for (const auto& [name, value] : outcome.metrics) absl::StrAppendFormat(&metrics, " %s %.4f", name, value);
    Log(absl::StrFormat("evaluation loss %.4f%s", eval_loss_, metrics));
    if (assignment_.rank == 0) RecordFinalEvaluation();
  }
  if (!evaluated_last_step) {
    QLORA_RETURN_IF_ERROR(GenerateSamples(total_steps_));
    if (assignment_.rank == 0) RecordSamples(total_steps_);
  }
  QLORA_ASSIGN_OR_RETURN(const TrainSummary summary, Summarize());
  // The final adapter: the full fp32 weights gathered, written by rank 0 with its model card.
  const std::string adapter = assignment_.output_dir + "/adapter";
  QLORA_RETURN_IF_ERROR(WriteAdapter(adapter));
  if (metrics_ != nullptr) {  // rank 0's: the HParams tab shows the run as succeeded
    metrics_->RecordAdapter(adapter);
    if (absl::Status s = metrics_->RecordEnd(true, absl::ToUnixMicros(absl::Now()) / 1e6); !s.ok()) {
      Log(absl::StrCat("metrics: the run's end was not recorded: ", s.message()));
    }
  }
  TrainingOutcome outcome;
  if (assignment_.rank == 0) {
    outcome.adapter_path = adapter;
    outcome.summary = summary;
    QLORA_RETURN_IF_ERROR(WriteModelCard(adapter, {&config_, assignment_.world_size, summary}));
    Log(absl::StrCat("adapter written to ", adapter));
    if (config_.lora.merge_adapter_into_base_model) {
      outcome.merged_path = assignment_.output_dir + "/merged";
      engine::MergeOptions merge;
      merge.base_model_dir = config_.base_model_path;
      QLORA_RETURN_IF_ERROR(engine::SaveMergedModel(*model_, outcome.merged_path, merge));
      Log(absl::StrCat("merged model written to ", outcome.merged_path));
      if (!config_.gguf_type.empty()) {
        gguf::GgufExportOptions gguf;
        QLORA_ASSIGN_OR_RETURN(gguf.type, gguf::ParseGgufType(config_.gguf_type));
        gguf.name = config_.name.empty() ? config_.base_model : config_.name;
        const std::string file = absl::StrCat(assignment_.output_dir, "/model-", config_.gguf_type, ".gguf");
        QLORA_RETURN_IF_ERROR(gguf::ExportGguf(outcome.merged_path, file, gguf));
        Log(absl::StrCat("GGUF written to ", file));
      }
    }
    Log(FormatTrainSummary(summary));
  } else if (config_.lora.merge_adapter_into_base_model) {
    QLORA_RETURN_IF_ERROR(engine::JoinMergedModelSave(*model_));  // rank 0's gathers
  }
  if (const engine::BaseWeightStore* store = model_->base_weight_store()) {
    const engine::BaseWeightStats w = store->stats();
    Log(absl::StrFormat("base weights: %d layers made whole (%d prefetched), %.1f MiB gathered, "
                        "%.1f MiB copied from host memory, %.2fs waited",
                        w.fetches, w.prefetched, w.gathered_bytes / 1048576.0,
                        w.copied_bytes / 1048576.0, w.waited_seconds));
  }
  QLORA_RETURN_IF_ERROR(communicator_->Barrier(absl::Minutes(5)));
  return outcome;
}

bool Trainer::MustResolveBeforeNext(const QueuedStep& queued) const {
  const TrainerConfig& t = config_.trainer;
  const int64_t done = queued.result.step;
  // The memory plans look at the first two steps' peaks (checkpointing_budget.h,
  // dequantized_weights.h) and may change the model before the next. One rank alone knows
  // whether its clock calls for a checkpoint.
  constexpr int64_t kPlannedSteps = 2;
  return communicator_->world_size() > 1 || totals_.steps < kPlannedSteps ||
         done >= total_steps_ || queued.due_here ||
         (t.steps_per_checkpoint > 0 && done % t.steps_per_checkpoint == 0) ||
         (validation_ != nullptr && t.eval_steps > 0 && done % t.eval_steps == 0);
}

absl::StatusOr<TrainingOutcome> Trainer::Run() {
  QLORA_ASSIGN_OR_RETURN(int64_t start_step, Resume());
  // One step behind (see trainer.h): `behind` is queued, its values not read yet.
  std::optional<QueuedStep> behind;
  auto finish_behind = [&]() -> absl::Status {
    if (!behind.has_value()) return absl::OkStatus();
    QueuedStep queued = std::move(*behind);
    behind.reset();
    QLORA_ASSIGN_OR_RETURN(StepResult result, Resolve(queued));
    return After(result);
  };
  for (int64_t step = start_step; step < total_steps_; ++step) {
    if (context_.should_stop()) {
      QLORA_RETURN_IF_ERROR(finish_behind());
      return absl::CancelledError("stopped on request");
    }
    QLORA_ASSIGN_OR_RETURN(QueuedStep queued, QueueStep(step));
    QLORA_RETURN_IF_ERROR(finish_behind());  // the previous step, while this one runs
    behind = std::move(queued);
    if (MustResolveBeforeNext(*behind)) QLORA_RETURN_IF_ERROR(finish_behind());
  }
  QLORA_RETURN_IF_ERROR(finish_behind());
  return Finish();
}

}  // namespace qlora::worker
