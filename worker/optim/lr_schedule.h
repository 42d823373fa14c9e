// Learning-rate schedules of transformers' get_{constant,linear,cosine}_schedule_with_warmup
// (LambdaLR semantics): the rate used by optimizer step k+1 is base_lr * lambda(k), k being the
// number of steps already taken, so with warmup the first step runs at rate 0.
#pragma once

#include <cstdint>

#include "common/config/config_enums.h"

namespace qlora::optim {

// The job file's learning_rate_scheduler.decay (config_enums.h).
using LrScheduleKind = LrScheduler;

struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduler::kConstant;
  double base_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;   // num_training_steps (linear, cosine)
  double num_cycles = 0.5;   // cosine: half a cosine wave from base_lr to 0
};

// base_lr * lambda(steps_taken).
double LearningRate(const LrScheduleOptions& options, int64_t steps_taken);

}  // namespace qlora::optim
