// EmitResolvedJobYaml: a JobConfig -> the canonical job file with every resolved field written
// out (the ZeRO stage, its reason as backend.trainer.strategy.zero_stage_reason, the resolved
// base_model_path, target_modules expanded). This is what the service stores and shows as the
// job's resolved configuration.
//
// Round trip: ParseJobConfig(EmitResolvedJobYaml(c), {.check_paths = false}) == c for any c that
// ParseJobConfig produced. Numbers are written in their shortest exact form and free-form
// strings double-quoted, so nothing is lost.
#pragma once

#include <string>

#include "common/config/job_config.h"

namespace qlora {

std::string EmitResolvedJobYaml(const JobConfig& config);

}  // namespace qlora
