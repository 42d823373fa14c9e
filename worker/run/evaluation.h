// Mean token loss over every rank's validation batches (no gradients, dropout off for the pass).
// Collective. Torch side.
#pragma once

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/engine/llama_model.h"
#include "worker/run/micro_batches.h"

namespace qlora::worker {

// NaN when no rank has a validation token.
absl::StatusOr<double> EvaluateLoss(engine::LlamaForCausalLM& model, MicroBatchSource& source,
                                    comm::Communicator& comm);

}  // namespace qlora::worker
