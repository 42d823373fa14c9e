// One line for a run's TrainSummary, as the worker logs it, the coordinator's completion event
// carries it and `qloractl get` prints it:
//   train_runtime 12.3s, train_loss 1.2345, steps 40, samples 320, tokens 20480,
//   train_samples_per_second 26.0, train_steps_per_second 3.25, tokens/s 1665,
//   peak_memory 812.4 MiB, eval_loss 1.3000 (best 1.2900)
// Torch-free and protobuf-free.
#pragma once

#include <string>

#include "common/worker_protocol.h"

namespace qlora {

std::string FormatTrainSummary(const TrainSummary& summary);

}  // namespace qlora
