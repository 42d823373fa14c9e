// ComputeTokenLogProbs against its formula: log_softmax(hidden @ lm_head^T) at the shifted
// targets, and its recomputing backward against autograd through the plain computation, with
// chunks smaller than the targets so that the chunk seams are crossed.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "worker/engine/token_log_probs.h"

namespace qlora::engine {
namespace {

struct Inputs {
  at::Tensor hidden, lm_head, targets;
};

Inputs MakeInputs() {
  at::manual_seed(3);
  Inputs in;
  in.hidden = at::randn({3, 7, 16}, at::kFloat);
  in.lm_head = at::randn({50, 16}, at::kFloat) * 0.3;
  in.targets = at::randint(0, 50, {3, 7}, at::kLong);
  in.targets.index_put_({0, at::indexing::Slice(0, 4)}, -100);  // a prompt
  in.targets.index_put_({2, at::indexing::Slice(5, 7)}, -100);  // padding
  return in;
}

// The plain computation: every position's logits at once.
at::Tensor Reference(const at::Tensor& hidden, const at::Tensor& lm_head, const at::Tensor& targets) {
  const at::Tensor logp = at::log_softmax(at::matmul(hidden, lm_head.t()), -1);  // [rows, seq, vocab]
  const at::Tensor next = targets.slice(1, 1);
  const at::Tensor picked = logp.slice(1, 0, -1).gather(2, next.clamp_min(0).unsqueeze(2)).squeeze(2);
  const at::Tensor masked = at::where(next != -100, picked, at::zeros_like(picked));
  return at::cat({at::zeros({hidden.size(0), 1}), masked}, 1);
}

TEST(TokenLogProbs, EqualsLogSoftmaxAtTheShiftedTargets) {
  const Inputs in = MakeInputs();
  const TokenLogProbs t = ComputeTokenLogProbs(in.hidden, in.lm_head, in.targets, /*chunk_size=*/4);
  ASSERT_EQ(t.logps.sizes(), in.targets.sizes());
  EXPECT_TRUE(at::allclose(t.logps, Reference(in.hidden, in.lm_head, in.targets), 1e-5, 1e-6));
  // The logits' vocabulary mean where a target is, 0 elsewhere.
  const at::Tensor means = at::matmul(in.hidden, in.lm_head.t()).mean(-1).slice(1, 0, -1);
  const at::Tensor want = at::where(in.targets.slice(1, 1) != -100, means, at::zeros_like(means));
  EXPECT_TRUE(at::allclose(t.mean_logits.slice(1, 1), want, 1e-5, 1e-6));
  EXPECT_EQ(t.mean_logits.slice(1, 0, 1).abs().sum().item<float>(), 0.0f);
}

TEST(TokenLogProbs, BackwardEqualsAutogradThroughTheFormula) {
  const Inputs in = MakeInputs();
  const at::Tensor weights = at::randn({3, 7});  // a loss that weighs each token differently
  const at::Tensor ours_hidden = in.hidden.clone().requires_grad_(true);
  (ComputeTokenLogProbs(ours_hidden, in.lm_head, in.targets, 4).logps * weights).sum().backward();
  const at::Tensor ref_hidden = in.hidden.clone().requires_grad_(true);
  (Reference(ref_hidden, in.lm_head, in.targets) * weights).sum().backward();
  EXPECT_TRUE(at::allclose(ours_hidden.grad(), ref_hidden.grad(), 1e-5, 1e-6))
      << (ours_hidden.grad() - ref_hidden.grad()).abs().max().item<float>();
  // Positions without a target downstream get no gradient.
  EXPECT_EQ(ours_hidden.grad()[0].slice(0, 0, 3).abs().sum().item<float>(), 0.0f);
}

TEST(TokenLogProbs, NoTargetsGiveZerosAndNoGradient) {
  Inputs in = MakeInputs();
  in.targets.fill_(-100);
  const at::Tensor hidden = in.hidden.clone().requires_grad_(true);
  const TokenLogProbs t = ComputeTokenLogProbs(hidden, in.lm_head, in.targets);
  EXPECT_EQ(t.logps.abs().sum().item<float>(), 0.0f);
  t.logps.sum().backward();
  EXPECT_EQ(hidden.grad().abs().sum().item<float>(), 0.0f);
}

// On CUDA in bf16 (the training dtype): the same values as the float32 formula over the same
// bf16 inputs, within the logits' bf16 rounding, and gradients to match.
TEST(TokenLogProbs, CudaBf16MatchesTheFormula) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const Inputs in = MakeInputs();
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor hidden = in.hidden.to(cuda, at::kBFloat16).requires_grad_(true);
  const at::Tensor lm_head = in.lm_head.to(cuda, at::kBFloat16);
  const at::Tensor weights = at::randn({3, 7});
  const TokenLogProbs t = ComputeTokenLogProbs(hidden, lm_head, in.targets.to(cuda), 4);
  (t.logps * weights.to(cuda)).sum().backward();
  const at::Tensor ref_hidden = hidden.detach().cpu().to(at::kFloat).requires_grad_(true);
  const at::Tensor want = Reference(ref_hidden, lm_head.cpu().to(at::kFloat), in.targets);
  (want * weights).sum().backward();
  EXPECT_TRUE(at::allclose(t.logps.cpu(), want.detach(), 2e-2, 5e-2))
      << (t.logps.cpu() - want).abs().max().item<float>();
  EXPECT_TRUE(at::allclose(hidden.grad().cpu().to(at::kFloat), ref_hidden.grad(), 2e-2, 2e-2))
      << (hidden.grad().cpu().to(at::kFloat) - ref_hidden.grad()).abs().max().item<float>();
}

}  // namespace
}  // namespace qlora::engine
