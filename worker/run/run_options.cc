// JobConfig -> engine, strategy and schedule options (see run_options.h).
#include "worker/run/run_options.h"

#include <cmath>

#include "common/config/hf_model_path.h"

namespace qlora::worker {

at::ScalarType ComputeScalarType(ComputeDtype dtype, const at::Device& device) {
  switch (dtype) {
    case ComputeDtype::kBFloat16: return at::kBFloat16;
    case ComputeDtype::kFloat16: return device.is_cpu() ? at::kFloat : at::kHalf;
    case ComputeDtype::kFloat32: return at::kFloat;
  }
  return at::kFloat;
}

engine::LoadOptions LoadOptionsFor(const JobConfig& config, const at::Device& device) {
  const QuantizationConfig& q = config.quantization;
  engine::LoadOptions load;
  load.quantize = q.enabled;
  load.quant_type = q.quant_type == QuantType::kFP4 ? kernels::QuantType::kFP4 : kernels::QuantType::kNF4;
  load.double_quant = q.double_quant;
  load.blocksize = q.blocksize;
  load.compute_dtype = ComputeScalarType(q.compute_dtype, device);
  load.float8_base_forward = q.enabled && q.float8_base_forward;
  load.device = device;
  return load;
}

engine::LoraOptions LoraOptionsFor(const JobConfig& config) {
  engine::LoraOptions lora;
  lora.r = config.lora.r;
  lora.alpha = config.lora.alpha;
  lora.dropout = config.lora.dropout;
  lora.target_modules = config.lora.target_modules;
  lora.use_rslora = config.lora.use_rslora;
  lora.seed = config.trainer.seed;
  return lora;
}

strategy::StrategyOptions StrategyOptionsFor(const JobConfig& config) {
  const TrainerConfig& t = config.trainer;
  strategy::StrategyOptions options;
  options.adamw.beta1 = t.beta1;
  options.adamw.beta2 = t.beta2;
  options.adamw.eps = t.eps;
  options.adamw.weight_decay = t.weight_decay;
  options.adamw_moments.in_host = config.backend.strategy.offload_optimizer;
  options.adamw_moments.pinned = config.backend.strategy.offload_optimizer_pin_memory;
  options.max_grad_norm = t.max_grad_norm;
  options.bucket_elements = config.backend.strategy.reduce_bucket_size;
  return options;
}

std::string AdapterBaseModelName(const JobConfig& config) {
  const bool from_hub_cache = LooksLikeHubRepoId(config.base_model) &&
                              config.base_model_path.find("/snapshots/") != std::string::npos;
  if (from_hub_cache || config.base_model_path.empty()) return config.base_model;
  return config.base_model_path;
}

optim::LrScheduleOptions LrScheduleFor(const JobConfig& config, int64_t total_steps) {
  optim::LrScheduleOptions schedule;
  schedule.kind = config.trainer.lr_scheduler;
  schedule.base_lr = config.trainer.learning_rate;
  schedule.total_steps = total_steps;
  schedule.warmup_steps = static_cast<int64_t>(std::ceil(config.trainer.warmup_fraction * total_steps));
  return schedule;
}

}  // namespace qlora::worker
