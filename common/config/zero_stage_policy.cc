// The ZeRO stage policy: which stage a job runs with, and the reason recorded with it.
#include "common/config/zero_stage_policy.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qlora {

absl::StatusOr<ZeroStageChoice> ChooseZeroStage(StrategyType strategy_type,
                                                std::optional<int> written_stage,
                                                bool written_auto, bool quantized_4bit,
                                                bool offload_param) {
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
            "weights whatever the budget"
          : "the original Ludwig design defaulted to stage 3, assuming a model that may not fit "
            "on one GPU; stage 2 (optimizer state and gradients partitioned) never waits for a "
            "gather; write stage: 3 to partition the base weights whatever the budget";
  if (offload_param) {
    return ZeroStageChoice{
        2, absl::StrCat(how, " with offload_param's device cpu, so stage 2 was chosen: ", why)};
  }
  return ZeroStageChoice{
      2,
      absl::StrCat(how, ", so each worker plans it from the memory budget (trainer.max_memory_gib, "
                        "else the smallest GPU's free memory): the lowest of stage 2 (the base "
                        "weights whole on every GPU), stage 3 (sharded across the GPUs) and "
                        "stage 3 with the base weights streamed from host memory whose planned "
                        "peak fits; stage 2 without a budget (a CPU). The job's log and progress "
                        "say which and why. Background: ",
                   why),
      /*automatic=*/true};
}

}  // namespace qlora
