// The one place that decides a job's ZeRO stage and says why (StrategyConfig::zero_stage and
// zero_stage_reason). ParseJobConfig calls it; nothing else chooses a stage.
//
//   strategy ddp                      -> 0
//   deepspeed, stage 0-3 written      -> that stage, "set in the job file"
//   deepspeed, no stage / stage: auto -> 2, with the reason (the original defaulted to 3,
//                                        assuming an unquantized model that may not fit one GPU)
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/config/config_enums.h"

namespace qlora {

struct ZeroStageChoice {
  int stage = 2;
  std::string reason;
};

inline constexpr char kZeroStageFromJobFile[] = "set in the job file";

// `strategy_type`: deepspeed or ddp; `written_stage` is the stage the file gives (nullopt
// when absent or "auto"), already checked to be in 0..3. Errors are INVALID_ARGUMENT whose
// message is the problem only (the caller adds file, line and field).
absl::StatusOr<ZeroStageChoice> ChooseZeroStage(StrategyType strategy_type,
                                                std::optional<int> written_stage,
                                                bool written_auto, bool quantized_4bit);

}  // namespace qlora
