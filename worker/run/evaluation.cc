// EvaluateLoss (see evaluation.h).
#include "worker/run/evaluation.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "common/status_macros.h"
#include "worker/engine/causal_lm_loss.h"
#include "worker/run/rank_sums.h"

namespace qlora::worker {

absl::StatusOr<double> EvaluateLoss(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                    comm::Communicator& comm) {
  c10::NoGradGuard no_grad;
  const engine::EvalModeScope eval(model);
  double loss_sum = 0, tokens = 0;
  QLORA_RETURN_IF_ERROR(source.Restart(0));
  while (true) {
    QLORA_ASSIGN_OR_RETURN(std::optional<DeviceBatch> batch, source.Next());
    if (!batch) break;
    at::Tensor hidden = model.Forward(batch->input_ids, batch->forward);
    engine::CausalLmLoss loss = engine::ComputeCausalLmLoss(hidden, model.lm_head, batch->labels);
    loss_sum += loss.loss_sum.item<double>();
    tokens += static_cast<double>(loss.num_tokens);
  }
  QLORA_ASSIGN_OR_RETURN(std::vector<double> total, SumOverRanks(comm, {loss_sum, tokens}, model.device()));
  return total[1] > 0 ? total[0] / total[1] : NAN;
}

}  // namespace qlora::worker
