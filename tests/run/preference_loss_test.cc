// The preference losses and TRL's metrics against their formulas, on numbers worked out here
// (preference_loss.h), and the gradients the policy's log-probabilities get.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "worker/run/preference_loss.h"

namespace qlora::worker {
namespace {

double LogSigmoid(double x) { return -std::log1p(std::exp(-x)); }

PairLogProbs TwoPairs() {
  PairLogProbs p;
  p.chosen = at::tensor({-10.0f, -20.0f}).requires_grad_(true);
  p.rejected = at::tensor({-12.0f, -18.0f}).requires_grad_(true);
  p.ref_chosen = at::tensor({-11.0f, -19.0f});
  p.ref_rejected = at::tensor({-11.5f, -19.5f});
  p.chosen_tokens = at::tensor({4.0f, 8.0f});
  p.rejected_tokens = at::tensor({5.0f, 6.0f});
  p.chosen_logits = at::tensor({2.0f, 4.0f});
  p.rejected_logits = at::tensor({-1.0f, 1.0f});
  return p;
}

double Metric(const PreferenceLossResult& r, TrainerType type, const std::string& name) {
  const std::vector<std::string> names = PreferenceMetricNames(type);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return r.metrics[static_cast<int64_t>(i)].item<double>();
  }
  ADD_FAILURE() << "no metric " << name;
  return NAN;
}

TEST(PreferenceLoss, DpoLossesAreTrlsFormulas) {
  // log-ratios: chosen (1, -1), rejected (-0.5, 1.5); d = (1.5, -2.5).
  const double beta = 0.5, d[2] = {1.5, -2.5};
  struct Want {
    PreferenceLoss type;
    double label_smoothing;
    double loss;
  };
  const double ipo[2] = {1.0 / 4 - (-0.5) / 5, -1.0 / 8 - 1.5 / 6};
  const double e = 0.2;
  const Want cases[] = {
      {PreferenceLoss::kSigmoid, 0, -(LogSigmoid(beta * d[0]) + LogSigmoid(beta * d[1])) / 2},
      {PreferenceLoss::kHinge, 0, (std::max(0.0, 1 - beta * d[0]) + std::max(0.0, 1 - beta * d[1])) / 2},
      {PreferenceLoss::kIpo, 0, (std::pow(ipo[0] - 1 / (2 * beta), 2) + std::pow(ipo[1] - 1 / (2 * beta), 2)) / 2},
      {PreferenceLoss::kRobust, e,
       ((-(1 - e) * LogSigmoid(beta * d[0]) + e * LogSigmoid(-beta * d[0])) +
        (-(1 - e) * LogSigmoid(beta * d[1]) + e * LogSigmoid(-beta * d[1]))) / (2 * (1 - 2 * e))},
  };
  for (const Want& want : cases) {
    PreferenceLossOptions o;
    o.beta = beta;
    o.loss_type = want.type;
    o.label_smoothing = want.label_smoothing;
    const PreferenceLossResult r = ComputePreferenceLoss(TwoPairs(), o);
    EXPECT_NEAR(r.loss.item<double>(), want.loss, 1e-6) << EnumName(want.type);
  }
  PreferenceLossOptions o;
  o.beta = beta;
  const PreferenceLossResult r = ComputePreferenceLoss(TwoPairs(), o);
  const TrainerType dpo = TrainerType::kDpo;
  EXPECT_NEAR(Metric(r, dpo, "rewards/chosen"), beta * (1 - 1) / 2, 1e-6);
  EXPECT_NEAR(Metric(r, dpo, "rewards/rejected"), beta * (-0.5 + 1.5) / 2, 1e-6);
  EXPECT_NEAR(Metric(r, dpo, "rewards/accuracies"), 0.5, 1e-12);
  EXPECT_NEAR(Metric(r, dpo, "rewards/margins"), beta * (1.5 - 2.5) / 2, 1e-6);
  EXPECT_NEAR(Metric(r, dpo, "logps/chosen"), -15, 1e-6);
  EXPECT_NEAR(Metric(r, dpo, "logps/rejected"), -15, 1e-6);
  EXPECT_NEAR(Metric(r, dpo, "logits/chosen"), 6.0 / 12, 1e-6);  // token-weighted
  EXPECT_NEAR(Metric(r, dpo, "logits/rejected"), 0.0, 1e-6);
}

TEST(PreferenceLoss, SigmoidGradientIsMinusBetaSigmaOfMinusBetaD) {
  PairLogProbs p = TwoPairs();
  PreferenceLossOptions o;
  o.beta = 0.5;
  ComputePreferenceLoss(p, o).loss.backward();
  // d loss / d logp_c = -beta sigma(-beta d) / pairs; the rejected side's is its negation.
  for (int i = 0; i < 2; ++i) {
    const double d = i == 0 ? 1.5 : -2.5;
    const double g = -0.5 / (1 + std::exp(0.5 * d)) / 2;
    EXPECT_NEAR(p.chosen.grad()[i].item<double>(), g, 1e-6);
    EXPECT_NEAR(p.rejected.grad()[i].item<double>(), -g, 1e-6);
  }
}

TEST(PreferenceLoss, PolicyEqualToItsReferenceGivesLn2) {
  PairLogProbs p = TwoPairs();
  p.ref_chosen = p.chosen.detach().clone();
  p.ref_rejected = p.rejected.detach().clone();
  for (PreferenceLoss type : {PreferenceLoss::kSigmoid, PreferenceLoss::kRobust}) {
    PreferenceLossOptions o;
    o.loss_type = type;
    o.label_smoothing = type == PreferenceLoss::kRobust ? 0.1 : 0;
    EXPECT_NEAR(ComputePreferenceLoss(p, o).loss.item<double>(), std::log(2.0), 1e-7) << EnumName(type);
  }
}

TEST(PreferenceLoss, OrpoIsNllMinusBetaLogSigmaOfTheLogOdds) {
  PairLogProbs p = TwoPairs();
  p.chosen_nll = at::tensor(2.5f);
  PreferenceLossOptions o;
  o.type = TrainerType::kOrpo;
  o.beta = 0.2;
  const PreferenceLossResult r = ComputePreferenceLoss(p, o);
  double ratio_sum = 0, odds_sum = 0;
  for (int i = 0; i < 2; ++i) {
    const double lc = (i == 0 ? -10.0 : -20.0) / (i == 0 ? 4 : 8);
    const double lr = (i == 0 ? -12.0 : -18.0) / (i == 0 ? 5 : 6);
    const double odds = (lc - lr) - (std::log1p(-std::exp(lc)) - std::log1p(-std::exp(lr)));
    ratio_sum += LogSigmoid(odds);
    odds_sum += odds;
  }
  EXPECT_NEAR(r.loss.item<double>(), 2.5 - 0.2 * ratio_sum / 2, 1e-6);
  const TrainerType orpo = TrainerType::kOrpo;
  EXPECT_NEAR(Metric(r, orpo, "nll_loss"), 2.5, 1e-6);
  EXPECT_NEAR(Metric(r, orpo, "log_odds_ratio"), ratio_sum / 2, 1e-6);
  EXPECT_NEAR(Metric(r, orpo, "log_odds_chosen"), odds_sum / 2, 1e-6);
  EXPECT_NEAR(Metric(r, orpo, "rewards/chosen"), 0.2 * (-2.5 - 2.5) / 2, 1e-6);  // beta x average logp
  EXPECT_NEAR(Metric(r, orpo, "logps/rejected"), (-2.4 - 3.0) / 2, 1e-6);
}

}  // namespace
}  // namespace qlora::worker
