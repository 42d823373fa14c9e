// The one place that decides a job's ZeRO stage and says why (StrategyConfig::zero_stage and
// zero_stage_reason). ParseJobConfig calls it; nothing else chooses a stage.
//
//   strategy ddp                      -> 0
//   deepspeed, stage 0-3 written      -> that stage, "set in the job file"
//   deepspeed, no stage / stage: auto -> planned by the workers (automatic; 2 until then) from
//                                        the memory budget (worker/memory/base_weight_plan.h),
//                                        unless offload_param's device is cpu (then 2)
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/config/config_enums.h"

namespace qlora {

struct ZeroStageChoice {
  int stage = 2;
  std::string reason;
  bool automatic = false;  // the workers plan it (StrategyConfig::zero_stage_auto)
};

inline constexpr char kZeroStageFromJobFile[] = "set in the job file";

// `strategy_type`: deepspeed or ddp; `written_stage` is the stage the file gives (nullopt
// when absent or "auto"), already checked to be in 0..3. Errors are INVALID_ARGUMENT whose
// message is the problem only (the caller adds file, line and field).
absl::StatusOr<ZeroStageChoice> ChooseZeroStage(StrategyType strategy_type,
                                                std::optional<int> written_stage,
                                                bool written_auto, bool quantized_4bit,
                                                bool offload_param = false);

}  // namespace qlora
