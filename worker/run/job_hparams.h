// The hyperparameters a run shows in TensorBoard's HParams tab (run_metrics.h writes them): the
// job-file keys that tell runs apart, named as the resolved job file names them, and the metrics
// to compare them by. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "common/config/job_config.h"
#include "common/tensorboard/hparams_summary.h"

namespace qlora::worker {

std::vector<tensorboard::HParam> JobHParams(const JobConfig& config, int world_size);
// The scalar tags the HParams tab shows beside them.
std::vector<std::string> JobHParamMetrics();

}  // namespace qlora::worker
