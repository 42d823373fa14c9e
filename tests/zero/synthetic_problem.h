// Test helper: a small differentiable training problem over several parameters of odd sizes,
// deterministic in (step, sample, token), with a variable number of target tokens per sample,
// and the single-process reference trainer the ZeRO strategies must reproduce.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "worker/optim/adamw.h"
#include "worker/optim/clip.h"
#include "worker/optim/lr_schedule.h"
#include "worker/strategy/strategy.h"

namespace qlora::testing {

struct SyntheticProblem {
  std::vector<std::vector<int64_t>> shapes = {{7, 3}, {5}, {11, 13}, {1}, {4, 4}};
  int samples_per_step = 8;  // the global batch; divisible by every world size tested
  int micro_batches = 2;     // per rank and step (gradient accumulation)
  optim::LrScheduleOptions schedule{optim::LrScheduleKind::kCosine, 0.05, 2, 8, 0.5};
  optim::AdamWOptions adamw{0.9, 0.999, 1e-8, 0.01};
  double max_grad_norm = 0.5;

  std::vector<strategy::TrainableParam> MakeParams(double phase = 0.0,
                                                  at::Device device = at::kCPU) const {
    std::vector<strategy::TrainableParam> params;
    for (size_t k = 0; k < shapes.size(); ++k) {
      int64_t n = 1;
      for (int64_t d : shapes[k]) n *= d;
      at::Tensor t = at::sin(at::arange(n, at::kFloat) * 0.37 + static_cast<double>(k) + phase)
                         .mul_(0.5).reshape(shapes[k]).to(device);
      t.set_requires_grad(true);
      params.push_back({"lora_" + std::to_string(k) + ".weight", t});
    }
    return params;
  }

  int64_t Tokens(int step, int sample) const { return 1 + (step * 7 + sample * 3) % 4; }

  // Sum over the sample's target tokens of (tanh(sum_k <p_k, x_k>) - y)^2.
  at::Tensor SampleLoss(const std::vector<strategy::TrainableParam>& params, int step,
                        int sample) const {
    const at::TensorOptions on = at::TensorOptions().dtype(at::kFloat).device(params[0].tensor.device());
    at::Tensor total = at::zeros({}, on);
    for (int64_t t = 0; t < Tokens(step, sample); ++t) {
      at::Tensor z = at::zeros({}, on);
      for (size_t k = 0; k < params.size(); ++k) {
        const double a = 0.11 + 0.013 * step + 0.029 * sample + 0.007 * t + 0.05 * k;
        at::Tensor x = at::cos(at::arange(params[k].tensor.numel(), on) * a + 0.3 * t)
                           .reshape(params[k].tensor.sizes());
        z = z + (params[k].tensor * x).sum();
      }
      const double y = std::sin(0.5 * step + sample + 0.25 * t);
      total = total + (at::tanh(z * 0.2) - y).pow(2);
    }
    return total;
  }

  int64_t StepTokens(int step, int world, int rank) const {
    int64_t n = 0;
    for (int s = rank; s < samples_per_step; s += world) n += Tokens(step, s);
    return n;
  }
};

// One process, the whole global batch per step, no strategy: what every stage and world size
// must reproduce. Trains from `params`' values for steps [0, steps).
inline std::vector<at::Tensor> ReferenceTrain(const SyntheticProblem& p, int steps,
                                              std::vector<double>* clip_coefficients = nullptr) {
  std::vector<strategy::TrainableParam> params = p.MakeParams();
  std::vector<optim::AdamW> adamw;
  for (const auto& param : params) {
    adamw.emplace_back(p.adamw, param.tensor.numel(), at::TensorOptions());
  }
  for (int step = 0; step < steps; ++step) {
    const int64_t tokens = p.StepTokens(step, 1, 0);
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (int s = 0; s < p.samples_per_step; ++s) loss = loss + p.SampleLoss(params, step, s);
    (loss * (1.0 / static_cast<double>(tokens))).backward();
    double sum_sq = 0;
    for (const auto& param : params) {
      sum_sq += param.tensor.grad().to(at::kDouble).pow(2).sum().item<double>();
    }
    const double coef = optim::ClipCoefficient(std::sqrt(sum_sq), p.max_grad_norm);
    if (clip_coefficients != nullptr) clip_coefficients->push_back(coef);
    const double lr = optim::LearningRate(p.schedule, step);
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor grad = params[k].tensor.grad().reshape({-1}).clone();
      if (coef < 1.0) grad.mul_(coef);
      adamw[k].Step(lr, params[k].tensor.detach().view({-1}), grad);
      params[k].tensor.mutable_grad().reset();
    }
  }
  std::vector<at::Tensor> out;
  for (const auto& param : params) out.push_back(param.tensor.detach().clone());
  return out;
}

// Hands the micro-batch's gradients to the strategy one OnGradientReady call per parameter
// (last first, as backward produces them) instead of TakeGradsFromParams' one batch.
inline absl::Status ReportGradsOneByOne(strategy::DistributedStrategy& s) {
  for (int i = static_cast<int>(s.params().size()) - 1; i >= 0; --i) {
    at::Tensor& grad = s.params()[i].tensor.mutable_grad();
    if (!grad.defined()) continue;
    if (absl::Status st = s.OnGradientReady(i, grad); !st.ok()) return st;
    grad.reset();
  }
  return absl::OkStatus();
}

// One rank's training steps [from, to) through a strategy, as the engine drives it
// (one_by_one: the gradients reported parameter by parameter).
inline absl::Status TrainSteps(const SyntheticProblem& p, strategy::DistributedStrategy& s,
                               int world, int rank, int from, int to, bool one_by_one = false) {
  for (int step = from; step < to; ++step) {
    auto scale = s.ComputeLossScale(p.StepTokens(step, world, rank));
    if (!scale.ok()) return scale.status();
    std::vector<int> mine;
    for (int sample = rank; sample < p.samples_per_step; sample += world) mine.push_back(sample);
    for (int m = 0; m < p.micro_batches; ++m) {
      at::Tensor loss = at::zeros({}, s.params()[0].tensor.options());
      for (size_t i = m; i < mine.size(); i += p.micro_batches) {
        loss = loss + p.SampleLoss(s.params(), step, mine[i]);
      }
      (loss * scale->scale).backward();
      absl::Status st = one_by_one ? ReportGradsOneByOne(s) : s.TakeGradsFromParams();
      if (st.ok()) st = s.EndMicroBatch();
      if (!st.ok()) return st;
    }
    if (s.steps_taken() != step) return absl::InternalError("step count drifted");
    auto report = s.Step(optim::LearningRate(p.schedule, step));
    if (!report.ok()) return report.status();
  }
  return absl::OkStatus();
}

// max |a - b| / max(1, max |b|) over all parameters.
inline double MaxRelativeError(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const double diff = (a[k] - b[k]).abs().max().item<double>();
    const double scale = std::max(1.0, b[k].abs().max().item<double>());
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace qlora::testing
