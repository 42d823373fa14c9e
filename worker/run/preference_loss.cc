// DPO and ORPO losses and TRL's metrics (see preference_loss.h).
#include "worker/run/preference_loss.h"

#include <ATen/ATen.h>

namespace qlora::worker {
namespace {

// log(1 - e^x) for x < 0, split at -ln 2 against cancellation (TRL's log1mexp).
at::Tensor Log1mExp(const at::Tensor& x) {
  return at::where(x < -0.6931471805599453, at::log1p(-at::exp(x)), at::log(-at::expm1(x)));
}

at::Tensor Mean(const at::Tensor& x) { return x.to(at::kDouble).mean(); }

// Token-weighted mean: sum of summed values over the sum of counts (0 when no token).
at::Tensor PerToken(const at::Tensor& sums, const at::Tensor& tokens) {
  return sums.to(at::kDouble).sum() / tokens.to(at::kDouble).sum().clamp_min(1);
}

}  // namespace

std::vector<std::string> PreferenceMetricNames(TrainerType type) {
  std::vector<std::string> names = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                    "rewards/margins", "logps/chosen",    "logps/rejected",
                                    "logits/chosen",  "logits/rejected"};
  if (type == TrainerType::kOrpo) {
    for (const char* name : {"nll_loss", "log_odds_ratio", "log_odds_chosen"}) names.push_back(name);
  }
  return names;
}

PreferenceLossResult ComputePreferenceLoss(const PairLogProbs& p, const PreferenceLossOptions& o) {
  PreferenceLossResult result;
  at::Tensor chosen_rewards, rejected_rewards, logps_chosen, logps_rejected;
  std::vector<at::Tensor> extra;
  if (o.type == TrainerType::kOrpo) {
    const at::Tensor lc = p.chosen / p.chosen_tokens.clamp_min(1);
    const at::Tensor lr = p.rejected / p.rejected_tokens.clamp_min(1);
    const at::Tensor log_odds = (lc - lr) - (Log1mExp(lc) - Log1mExp(lr));
    const at::Tensor ratio = at::log_sigmoid(log_odds);
    const at::Tensor nll = p.chosen_nll.reshape({});
    result.loss = nll - (o.beta * ratio).mean();
    chosen_rewards = o.beta * lc.detach();
    rejected_rewards = o.beta * lr.detach();
    logps_chosen = lc.detach();
    logps_rejected = lr.detach();
    extra = {nll.detach().to(at::kDouble), Mean(ratio.detach()), Mean(log_odds.detach())};
  } else {
    const at::Tensor chosen_ratio = p.chosen - p.ref_chosen;
    const at::Tensor rejected_ratio = p.rejected - p.ref_rejected;
    const at::Tensor d = chosen_ratio - rejected_ratio;
    at::Tensor per_pair;
    switch (o.loss_type) {
      case PreferenceLoss::kSigmoid: per_pair = -at::log_sigmoid(o.beta * d); break;
      case PreferenceLoss::kHinge: per_pair = at::relu(1 - o.beta * d); break;
      case PreferenceLoss::kIpo: {
        const at::Tensor averaged = chosen_ratio / p.chosen_tokens.clamp_min(1) -
                                    rejected_ratio / p.rejected_tokens.clamp_min(1);
        per_pair = (averaged - 1 / (2 * o.beta)).pow(2);
        break;
      }
      case PreferenceLoss::kRobust: {
        const double e = o.label_smoothing;
        per_pair = (-(1 - e) * at::log_sigmoid(o.beta * d) + e * at::log_sigmoid(-o.beta * d)) / (1 - 2 * e);
        break;
      }
    }
    result.loss = per_pair.mean();
    chosen_rewards = o.beta * chosen_ratio.detach();
    rejected_rewards = o.beta * rejected_ratio.detach();
    logps_chosen = p.chosen.detach();
    logps_rejected = p.rejected.detach();
  }
  std::vector<at::Tensor> metrics = {
      Mean(chosen_rewards),
      Mean(rejected_rewards),
      Mean((chosen_rewards > rejected_rewards).to(at::kDouble)),
      Mean(chosen_rewards - rejected_rewards),
      Mean(logps_chosen),
      Mean(logps_rejected),
      PerToken(p.chosen_logits, p.chosen_tokens),
      PerToken(p.rejected_logits, p.rejected_tokens)};
  for (at::Tensor& m : extra) metrics.push_back(m);
  result.metrics = at::stack(metrics).to(at::kDouble);
  return result;
}

}  // namespace qlora::worker
