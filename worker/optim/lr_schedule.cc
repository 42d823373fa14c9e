// The lambdas of transformers/optimization.py, transcribed.
#include "worker/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>


namespace qlora::optim {

double LearningRate(const LrScheduleOptions& o, int64_t step) {
  const double s = static_cast<double>(step);
  if (step < o.warmup_steps) {
    return o.base_lr * s / std::max(1.0, static_cast<double>(o.warmup_steps));
  }
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      return o.base_lr;
    case LrScheduleKind::kLinear:
      return o.base_lr * std::max(0.0, static_cast<double>(o.total_steps - step) / decay_steps);
    case LrScheduleKind::kCosine: {
      const double progress = static_cast<double>(step - o.warmup_steps) / decay_steps;
      return o.base_lr *
             std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * o.num_cycles * 2.0 * progress)));
    }
  }
  return o.base_lr;
}

}  // namespace qlora::optim
