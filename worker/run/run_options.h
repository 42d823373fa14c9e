// The one place where a resolved JobConfig becomes the options of the engine (load, LoRA), the
// strategy and the learning-rate schedule. Torch side (dtypes and devices are ATen's).
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "common/config/job_config.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/llama_model.h"
#include "worker/optim/lr_schedule.h"
#include "worker/strategy/strategy.h"

namespace qlora::worker {

// The compute dtype on `device` (fp16 on a CPU runs in fp32: CPU fp16 matmuls are emulated).
at::ScalarType ComputeScalarType(ComputeDtype dtype, const at::Device& device);
engine::LoadOptions LoadOptionsFor(const JobConfig& config, const at::Device& device);
engine::LoraOptions LoraOptionsFor(const JobConfig& config);
strategy::StrategyOptions StrategyOptionsFor(const JobConfig& config);
// adapter_config.json's base_model_name_or_path, so that peft finds the base from any folder:
// the hub id the job named where the model came from the hub cache, else the resolved absolute
// folder (a relative base_model would only resolve from where the job was submitted).
std::string AdapterBaseModelName(const JobConfig& config);
// Warm-up is ceil(warmup_fraction x total_steps) steps, as HF's get_*_schedule_with_warmup
// callers compute it.
optim::LrScheduleOptions LrScheduleFor(const JobConfig& config, int64_t total_steps);

}  // namespace qlora::worker
