// RunTrainingJob: one rank's training run (see training_job.h). Wires the pieces together:
// communicator (Gloo on CPU, NCCL on GPU) -> model (NF4 base + LoRA) -> ZeRO strategy ->
// data (own shards, tokenized, micro-batched) -> loop (accumulate, step, report, checkpoint,
// evaluate) -> PEFT adapter (rank 0).
#include "worker/run/training_job.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/data/data_loader.h"
#include "worker/engine/causal_lm_loss.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/peft_io.h"
#include "worker/optim/lr_schedule.h"
#include "worker/run/device_memory.h"
#include "worker/run/micro_batches.h"
#include "worker/strategy/strategy.h"
#ifdef QLORA_HAVE_NCCL
#include "worker/comm/nccl_communicator.h"
#endif

namespace qlora::worker {
namespace {

void Log(int rank, const std::string& line) {
  fprintf(stderr, "[rank %d] %s\n", rank, line.c_str());
  fflush(stderr);
}

// Wraps a borrowed store for APIs that take shared ownership.
std::shared_ptr<comm::RendezvousStore> Borrow(comm::RendezvousStore* store) {
  return std::shared_ptr<comm::RendezvousStore>(store, [](comm::RendezvousStore*) {});
}

absl::StatusOr<at::ScalarType> ComputeDtype(const std::string& name) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float32") return at::kFloat;
  return absl::InvalidArgumentError(absl::StrCat("unknown compute dtype ", name));
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> Connect(const TrainingContext& ctx, int device) {
  const WorkerAssignment& a = ctx.assignment;
  const std::string prefix = absl::StrCat(a.job_id, "/gen-", a.generation);
#ifdef QLORA_HAVE_NCCL
  if (a.device == "cuda") {
    comm::NcclOptions o;
    o.rank = a.rank;
    o.world_size = a.world_size;
    o.device = device;
    o.unique_id = a.nccl_unique_id;
    o.store = Borrow(ctx.store);
    o.prefix = prefix;
    return comm::ConnectNccl(o);
  }
#endif
  (void)device;
  comm::GlooOptions o;
  o.rank = a.rank;
  o.world_size = a.world_size;
  o.prefix = prefix;
  return comm::ConnectGloo(o, Borrow(ctx.store));
}

// The newest complete checkpoint (a folder with manifest.json) under `dir`, or "". POSIX calls:
// std::filesystem is unusable in processes that load libtorch.so (it exports its own copy).
std::string LatestCheckpoint(const std::string& dir) {
  std::string best;
  int64_t best_step = -1;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return best;
  while (const dirent* entry = readdir(d)) {
    int64_t step = 0;
    if (sscanf(entry->d_name, "step-%ld", &step) != 1) continue;
    const std::string path = absl::StrCat(dir, "/", entry->d_name);
    struct stat st;
    if (stat((path + "/manifest.json").c_str(), &st) != 0) continue;
    if (step > best_step) {
      best_step = step;
      best = path;
    }
  }
  closedir(d);
  return best;
}

// Deterministic for a seed: libtorch seeds its default generators from the OS, and LoRA dropout
// draws from them. Seeding from (job seed, rank, step) at every step gives each rank its own
// masks and makes a run resumed from a checkpoint draw exactly what an uninterrupted one does.
void SeedGenerators(const at::Device& device, uint64_t job_seed, int rank, int64_t step) {
  const uint64_t seed = (job_seed * 1000003u + static_cast<uint64_t>(rank)) * 1000003u + static_cast<uint64_t>(step);
  {
    at::Generator cpu = at::globalContext().defaultGenerator(at::kCPU);
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_current_seed(seed);
  }
  if (device.is_cuda()) {
    at::Generator gpu = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gpu.mutex());
    gpu.set_current_seed(seed);
  }
}

// Sums a few doubles over all ranks.
absl::StatusOr<std::vector<double>> SumOverRanks(comm::Communicator& comm, const std::vector<double>& values,
                                                 const at::Device& device) {
  at::Tensor t = at::tensor(at::ArrayRef<double>(values), at::TensorOptions().dtype(at::kDouble)).to(device);
  QLORA_RETURN_IF_ERROR(comm.AllReduceSum(t, absl::Minutes(5)));
  t = t.cpu();
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = t[i].item<double>();
  return out;
}

// Mean token loss over a rank's validation batches, averaged over all ranks.
absl::StatusOr<double> Evaluate(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                comm::Communicator& comm) {
  c10::NoGradGuard no_grad;
  const bool was_training = model.training();
  model.SetTraining(false);
  double loss_sum = 0, tokens = 0;
  QLORA_RETURN_IF_ERROR(source.Restart(0));
  while (true) {
    QLORA_ASSIGN_OR_RETURN(std::optional<DeviceBatch> batch, source.Next());
    if (!batch) break;
    at::Tensor hidden = model.Forward(batch->input_ids, batch->forward);
    engine::CausalLmLoss loss = engine::ComputeCausalLmLoss(hidden, model.lm_head, batch->labels);
    loss_sum += loss.loss_sum.item<double>();
    tokens += static_cast<double>(loss.num_tokens);
  }
  model.SetTraining(was_training);
  QLORA_ASSIGN_OR_RETURN(std::vector<double> total, SumOverRanks(comm, {loss_sum, tokens}, model.device()));
  return total[1] > 0 ? total[0] / total[1] : NAN;
}

absl::StatusOr<TrainingOutcome> Run(const TrainingContext& ctx) {
  const JobConfig& cfg = ctx.config;
  const WorkerAssignment& a = ctx.assignment;
  const int rank = a.rank;
  const at::Device device = a.device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  QLORA_ASSIGN_OR_RETURN(at::ScalarType dtype, ComputeDtype(cfg.quantization.compute_dtype));
  if (device.is_cpu() && dtype == at::kHalf) dtype = at::kFloat;  // fp16 matmuls on CPU are emulated

  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> communicator, Connect(ctx, 0));
  Log(rank, absl::StrCat("joined ", a.world_size, " ranks over ", a.device == "cuda" ? "NCCL" : "Gloo"));

  engine::LoadOptions load;
  load.quantize = cfg.quantization.enabled;
  load.quant_type = cfg.quantization.quant_type == "fp4" ? kernels::QuantType::kFP4 : kernels::QuantType::kNF4;
  load.double_quant = cfg.quantization.double_quant;
  load.blocksize = cfg.quantization.blocksize;
  load.compute_dtype = dtype;
  load.device = device;
  engine::UseMmapForLargeHostAllocations();  // host memory stays near one tensor while loading
  const auto load_start = std::chrono::steady_clock::now();
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<engine::LlamaForCausalLM> model,
                         engine::LoadLlama(cfg.base_model_path, load));
  Log(rank, absl::StrFormat("loaded %s (%d layers, %s) in %.1fs", cfg.base_model_path,
                            model->config().num_hidden_layers,
                            cfg.quantization.enabled ? cfg.quantization.quant_type : "unquantized",
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count()));
  engine::LoraOptions lora;
  lora.r = cfg.lora.r;
  lora.alpha = cfg.lora.alpha;
  lora.dropout = cfg.lora.dropout;
  lora.target_modules = cfg.lora.target_modules;
  lora.use_rslora = cfg.lora.use_rslora;
  lora.seed = cfg.trainer.seed;
  QLORA_RETURN_IF_ERROR(model->AddLora(lora));
  model->SetTraining(true);
  model->SetGradientCheckpointing(cfg.trainer.gradient_checkpointing);

  std::vector<strategy::TrainableParam> params;
  for (auto& [name, tensor] : model->TrainableParameters()) params.push_back({name, tensor});
  strategy::StrategyOptions sopt;
  sopt.adamw.beta1 = cfg.trainer.beta1;
  sopt.adamw.beta2 = cfg.trainer.beta2;
  sopt.adamw.eps = cfg.trainer.eps;
  sopt.adamw.weight_decay = cfg.trainer.weight_decay;
  sopt.max_grad_norm = cfg.trainer.max_grad_norm;
  sopt.bucket_elements = cfg.backend.strategy.reduce_bucket_size;
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<strategy::DistributedStrategy> strat,
                         strategy::MakeStrategy(cfg.backend.strategy.zero_stage, sopt, *communicator, params));

  // Data: this rank's shards, micro-batched.
  MicroBatchOptions mb;
  mb.config = &cfg;
  mb.model_dir = cfg.base_model_path;
  mb.device = device;
  mb.rank = rank;
  const bool split_train = a.validation_shards.empty() && cfg.data.validation_fraction > 0;
  if (split_train) mb.split = MicroBatchOptions::Split::kTrain;
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<MicroBatchSource> train, MicroBatchSource::Open(a.train_shards, mb));
  std::unique_ptr<MicroBatchSource> validation;
  if (!a.validation_shards.empty() || split_train) {
    MicroBatchOptions vb = mb;
    vb.batch_size = cfg.trainer.eval_batch_size;
    vb.shuffle = false;
    vb.split = split_train ? MicroBatchOptions::Split::kValidation : MicroBatchOptions::Split::kAll;
    QLORA_ASSIGN_OR_RETURN(validation, MicroBatchSource::Open(split_train ? a.train_shards : a.validation_shards, vb));
  }
  const int64_t accumulation = cfg.trainer.gradient_accumulation_steps;
  // Every rank runs the same number of optimizer steps in an epoch: the rank with the fewest
  // micro-batches sets it (data::PlanEpoch); the others leave the rest of their share for that
  // epoch (a different tail each epoch, as the shuffle changes).
  auto plan_epoch = [&](int epoch) -> absl::StatusOr<int64_t> {
    QLORA_ASSIGN_OR_RETURN(int64_t local, train->CountMicroBatches(epoch));
    std::vector<double> one_hot(a.world_size, 0.0);
    one_hot[rank] = static_cast<double>(local);
    QLORA_ASSIGN_OR_RETURN(std::vector<double> counts, SumOverRanks(*communicator, one_hot, device));
    std::vector<int64_t> per_rank(counts.begin(), counts.end());
    QLORA_ASSIGN_OR_RETURN(data::EpochPlan plan, data::PlanEpoch(per_rank, static_cast<int>(accumulation)));
    if (plan.optimizer_steps == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the dataset is too small: a rank has ", *std::min_element(per_rank.begin(), per_rank.end()),
          " micro-batches of ", cfg.trainer.batch_size, " but one optimizer step needs ", accumulation,
          " per rank (gradient_accumulation_steps)"));
    }
    QLORA_RETURN_IF_ERROR(train->Restart(epoch));
    return plan.optimizer_steps;
  };
  QLORA_ASSIGN_OR_RETURN(int64_t steps_per_epoch, plan_epoch(0));
  const int64_t total_steps = cfg.trainer.train_steps > 0 ? cfg.trainer.train_steps : steps_per_epoch * cfg.trainer.epochs;
  optim::LrScheduleOptions sched;
  QLORA_ASSIGN_OR_RETURN(sched.kind, optim::ParseLrScheduleKind(cfg.trainer.lr_scheduler));
  sched.base_lr = cfg.trainer.learning_rate;
  sched.total_steps = total_steps;
  sched.warmup_steps = static_cast<int64_t>(std::ceil(cfg.trainer.warmup_fraction * total_steps));
  Log(rank, absl::StrFormat("%d optimizer steps (%d per epoch), ZeRO stage %d, %d micro-batches of %d per step",
                            total_steps, steps_per_epoch, cfg.backend.strategy.zero_stage, accumulation,
                            cfg.trainer.batch_size));

  // Resume from the newest complete checkpoint of this job, if any (scoped by job id: another job
  // writing to the same output_dir never resumes from it).
  const std::string checkpoints = absl::StrCat(a.output_dir, "/checkpoints/", a.job_id);
  int64_t start_step = 0;
  if (const std::string latest = LatestCheckpoint(checkpoints); !latest.empty()) {
    QLORA_ASSIGN_OR_RETURN(strategy::ResumeReport resumed, strat->LoadCheckpoint(latest));
    start_step = resumed.step;
    Log(rank, absl::StrCat("resumed from ", latest, ": ", resumed.description));
  }

  // Replay the data order up to the resumed step (epochs are re-planned as in the first run).
  int epoch = 0;
  int64_t epoch_steps = steps_per_epoch;
  int64_t in_epoch = 0;  // optimizer steps taken in the current epoch
  for (int64_t s = 0; s < start_step; ++s) {
    if (in_epoch == epoch_steps) {
      ++epoch;
      in_epoch = 0;
      QLORA_ASSIGN_OR_RETURN(epoch_steps, plan_epoch(epoch));
    }
    for (int64_t i = 0; i < accumulation; ++i) QLORA_RETURN_IF_ERROR(train->Next().status());
    ++in_epoch;
  }

  const auto started = std::chrono::steady_clock::now();
  double eval_loss = NAN;
  for (int64_t step = start_step; step < total_steps; ++step) {
    if (ctx.should_stop()) return absl::CancelledError("stopped on request");
    const auto step_start = std::chrono::steady_clock::now();
    SeedGenerators(device, cfg.trainer.seed, rank, step);
    // One optimizer step's micro-batches; a new epoch starts when its planned steps are done.
    if (in_epoch == epoch_steps) {
      ++epoch;
      in_epoch = 0;
      QLORA_ASSIGN_OR_RETURN(epoch_steps, plan_epoch(epoch));
    }
    std::vector<DeviceBatch> batches;
    for (int64_t i = 0; i < accumulation; ++i) {
      QLORA_ASSIGN_OR_RETURN(std::optional<DeviceBatch> batch, train->Next());
      if (!batch) return absl::InternalError("the data ran out before the epoch's planned steps");
      batches.push_back(std::move(*batch));
    }
    ++in_epoch;
    int64_t local_tokens = 0, local_input_tokens = 0;
    for (const DeviceBatch& b : batches) {
      local_tokens += b.target_tokens;
      local_input_tokens += b.input_tokens;
    }
    QLORA_ASSIGN_OR_RETURN(strategy::LossScale scale, strat->ComputeLossScale(local_tokens));
    double local_loss = 0;
    for (const DeviceBatch& b : batches) {
      at::Tensor hidden = model->Forward(b.input_ids, b.forward);
      engine::CausalLmLoss loss = engine::ComputeCausalLmLoss(hidden, model->lm_head, b.labels);
      local_loss += loss.loss_sum.item<double>();
      (loss.loss_sum * scale.scale).backward();
      QLORA_RETURN_IF_ERROR(strat->TakeGradsFromParams());
      QLORA_RETURN_IF_ERROR(strat->EndMicroBatch());
    }
    const double lr = optim::LearningRate(sched, strat->steps_taken());
    QLORA_ASSIGN_OR_RETURN(strategy::StepReport report, strat->Step(lr));
    QLORA_ASSIGN_OR_RETURN(std::vector<double> global_loss, SumOverRanks(*communicator, {local_loss}, device));

    const int64_t done = step + 1;
    if (validation && cfg.trainer.eval_steps > 0 && done % cfg.trainer.eval_steps == 0) {
      QLORA_ASSIGN_OR_RETURN(eval_loss, Evaluate(*model, *validation, *communicator));
    }
    if (cfg.trainer.steps_per_checkpoint > 0 && done % cfg.trainer.steps_per_checkpoint == 0 && done < total_steps) {
      const std::string dir = absl::StrCat(checkpoints, "/step-", done);
      QLORA_RETURN_IF_ERROR(strat->SaveCheckpoint(dir));
      Log(rank, absl::StrCat("checkpoint ", dir));
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    ProgressSnapshot p;
    p.rank = rank;
    p.step = done;
    p.total_steps = total_steps;
    p.epoch = epoch;
    p.loss = global_loss[0] * scale.scale;
    p.learning_rate = report.lr;
    p.tokens_per_second = step_seconds > 0 ? static_cast<double>(local_input_tokens) / step_seconds : 0;
    p.eval_loss = eval_loss;
    p.elapsed_seconds = elapsed;
    const strategy::MemoryReport m = strat->Memory();
    p.memory.master_weight_bytes = m.master_bytes;
    p.memory.optimizer_state_bytes = m.optimizer_bytes;
    p.memory.gradient_bytes = m.gradient_bytes;
    p.memory.comm_buffer_bytes = m.comm_buffer_bytes;
    FillDeviceMemory(device, &p.memory);
    ctx.report_progress(p);
    if (rank == 0) {
      Log(rank, absl::StrFormat("step %d/%d loss %.4f lr %.3g grad-norm %.3f tok/s %.0f", done, total_steps, p.loss,
                                report.lr, report.grad_norm, p.tokens_per_second));
    }
  }
  if (validation && !(cfg.trainer.eval_steps > 0 && total_steps % cfg.trainer.eval_steps == 0)) {
    QLORA_ASSIGN_OR_RETURN(eval_loss, Evaluate(*model, *validation, *communicator));
    Log(rank, absl::StrFormat("evaluation loss %.4f", eval_loss));
  }

  // The final adapter: the full fp32 weights gathered, written by rank 0.
  QLORA_ASSIGN_OR_RETURN(std::vector<at::Tensor> weights, strat->GatherMasterWeights());
  {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].tensor.copy_(weights[i]);
  }
  TrainingOutcome outcome;
  if (rank == 0) {
    outcome.adapter_path = a.output_dir + "/adapter";
    engine::AdapterSaveOptions save;
    save.base_model_name_or_path = cfg.base_model;
    QLORA_RETURN_IF_ERROR(engine::SaveAdapter(*model, outcome.adapter_path, save));
    Log(rank, absl::StrCat("adapter written to ", outcome.adapter_path));
    if (cfg.lora.merge_adapter_into_base_model) {
      QLORA_RETURN_IF_ERROR(engine::SaveMergedModel(*model, a.output_dir + "/merged"));
      Log(rank, absl::StrCat("merged model written to ", a.output_dir, "/merged"));
    }
  }
  QLORA_RETURN_IF_ERROR(communicator->Barrier(absl::Minutes(5)));
  return outcome;
}

}  // namespace

absl::StatusOr<TrainingOutcome> RunTrainingJob(const TrainingContext& context) {
  try {
    return Run(context);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("torch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("error: ", e.what()));
  }
}

}  // namespace qlora::worker
