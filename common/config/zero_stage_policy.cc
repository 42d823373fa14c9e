// The ZeRO stage policy: which stage a job runs with, and the reason recorded with it.
#include "common/config/zero_stage_policy.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qlora {

absl::StatusOr<ZeroStageChoice> ChooseZeroStage(StrategyType strategy_type,
                                                std::optional<int> written_stage,
                                                bool written_auto, bool quantized_4bit) {
  if (strategy_type == StrategyType::kDdp) {
    return ZeroStageChoice{0, "strategy 'ddp' is plain data parallelism, which is ZeRO stage 0 "
                              "(replicated optimizer state, all-reduced gradients)"};
  }
  if (written_stage.has_value()) return ZeroStageChoice{*written_stage, kZeroStageFromJobFile};
  const std::string how = written_auto ? "'auto' in the job file" : "not set in the job file";
  const std::string why =
      quantized_4bit
          ? "the original Ludwig design defaulted to stage 3, assuming an unquantized model that "
            "may not fit on one GPU; with 4-bit base weights each GPU usually holds a whole copy "
            "at a quarter of the bf16 size, and stage 2 (optimizer state and gradients "
            "partitioned) never waits for a gather; write stage: 3 to partition the 4-bit base "
            "weights too when they do not fit"
          : "the original Ludwig design defaulted to stage 3, assuming a model that may not fit "
            "on one GPU; stage 2 (optimizer state and gradients partitioned) never waits for a "
            "gather; write stage: 3 to partition the base weights too when they do not fit";
  return ZeroStageChoice{2, absl::StrCat(how, ", so stage 2 was chosen: ", why)};
}

}  // namespace qlora
