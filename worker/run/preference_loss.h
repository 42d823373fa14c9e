// The preference losses of one micro-batch of pairs, and TRL's metrics of it, from per-sequence
// log-probabilities: DPO as trl/trainer/dpo_trainer.py (1.16) computes it, ORPO as
// trl/experimental/orpo/orpo_trainer.py does.
//
// DPO (standard reverse-KL), per pair, with d = (logp_c - ref_c) - (logp_r - ref_r), the logps
// summed over each completion's tokens:
//   sigmoid  -log sigma(beta d)
//   hinge    relu(1 - beta d)
//   ipo      (d' - 1 / (2 beta))^2, d' the same difference with each side's log-ratio divided by
//            its completion's token count
//   robust   (-(1 - e) log sigma(beta d) + e log sigma(-beta d)) / (1 - 2e), e = label_smoothing
// The micro-batch's loss is the mean over its pairs. rewards/x = beta (logp_x - ref_x).
//
// ORPO, per pair, with the logps averaged over each completion's tokens:
//   log_odds = (lc - lr) - (log(1 - e^lc) - log(1 - e^lr)),   loss = nll - mean(beta log sigma(log_odds))
// where nll is the chosen sequences' mean token cross-entropy over prompt and completion (TRL's
// ORPO trains the prompt too). rewards/x = beta l_x.
//
// Metrics (TRL's names): rewards/{chosen,rejected,accuracies,margins}, logps/{chosen,rejected},
// logits/{chosen,rejected}; ORPO adds nll_loss, log_odds_ratio, log_odds_chosen. logits/x is
// the mean over the completions' tokens of the logits' mean over the vocabulary, as TRL's DPO
// computes it (its ORPO averages over padding and prompt too, a figure that depends on how wide
// the batch is padded; docs/preference.md).
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/config/config_enums.h"

namespace qlora::worker {

struct PreferenceLossOptions {
  TrainerType type = TrainerType::kDpo;  // kDpo or kOrpo
  double beta = 0.1;
  PreferenceLoss loss_type = PreferenceLoss::kSigmoid;
  double label_smoothing = 0;
};

// Per-pair inputs, each [pairs] float32 (differentiable where the policy's are).
struct PairLogProbs {
  at::Tensor chosen, rejected;              // the policy's, summed over the completion
  at::Tensor ref_chosen, ref_rejected;      // DPO: the reference's, summed (no grad)
  at::Tensor chosen_tokens, rejected_tokens;  // completion tokens per sequence
  at::Tensor chosen_logits, rejected_logits;  // summed mean logits over the completion (no grad)
  at::Tensor chosen_nll;                    // ORPO: scalar, the chosen rows' mean token NLL
};

struct PreferenceLossResult {
  at::Tensor loss;     // scalar float32: the micro-batch's loss (TRL's)
  at::Tensor metrics;  // [MetricNames().size()] float64, detached
};

// The metric names of `type`, in the order of PreferenceLossResult::metrics.
std::vector<std::string> PreferenceMetricNames(TrainerType type);

PreferenceLossResult ComputePreferenceLoss(const PairLogProbs& pairs, const PreferenceLossOptions& options);

}  // namespace qlora::worker
