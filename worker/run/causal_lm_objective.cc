// CausalLmObjective: forward and chunked cross-entropy (see causal_lm_objective.h).
#include "worker/run/causal_lm_objective.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "worker/engine/causal_lm_loss.h"
#include "worker/run/evaluation.h"

namespace qlora::worker {

MicroBatchLoss CausalLmObjective::Loss(engine::LlamaForCausalLM& model, const DeviceBatch& b, int,
                                       double grad_scale) {
  at::Tensor hidden;
  {
    RECORD_USER_SCOPE("qlora::forward");
    hidden = model.Forward(b.input_ids, b.forward);
  }
  RECORD_USER_SCOPE("qlora::loss");
  engine::LossOptions options;
  options.grad_scale = grad_scale;
  options.count_tokens = false;  // b.target_tokens has it, counted on the host
  return {engine::ComputeCausalLmLoss(hidden, model.lm_head, b.labels, options).loss_sum, at::Tensor()};
}

absl::StatusOr<EvalOutcome> CausalLmObjective::Evaluate(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                                        comm::Communicator& comm) {
  absl::StatusOr<double> loss = EvaluateLoss(model, source, comm);
  if (!loss.ok()) return loss.status();
  EvalOutcome outcome;
  outcome.loss = *loss;
  return outcome;
}

}  // namespace qlora::worker
