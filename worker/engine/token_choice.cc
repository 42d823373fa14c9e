// ProcessedScores and TokenChooser: transformers' logits processors and warpers
// (RepetitionPenaltyLogitsProcessor, MinNewTokensLengthLogitsProcessor, TemperatureLogitsWarper,
// TopKLogitsWarper, TopPLogitsWarper) computed on the host in float32.
#include "worker/engine/token_choice.h"

#include <algorithm>
#include <limits>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace qlora::engine {

at::Tensor ProcessedScores(const at::Tensor& logits, const std::vector<int64_t>& context,
                           const SamplingOptions& options, const std::vector<int64_t>& banned) {
  constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
  at::Tensor scores = logits.detach().to(at::kCPU, at::kFloat).reshape({-1}).clone();
  const int64_t vocab = scores.size(0);
  if (options.repetition_penalty != 1.0 && !context.empty()) {
    // Every token seen so far, once: negative scores multiplied, positive ones divided.
    const at::Tensor seen =
        at::tensor(context, at::kLong).clamp(0, vocab - 1);
    const at::Tensor score = scores.gather(0, seen);
    scores.scatter_(0, seen,
                    at::where(score < 0, score * options.repetition_penalty,
                              score / options.repetition_penalty));
  }
  if (!banned.empty()) {
    for (int64_t id : banned) {
      if (id >= 0 && id < vocab) scores[id] = kMinusInfinity;
    }
  }
  if (!options.do_sample) return scores;
  if (options.temperature != 1.0) scores = scores / options.temperature;
  if (options.top_k > 0 && options.top_k < vocab) {
    const at::Tensor kth = std::get<0>(scores.topk(options.top_k)).select(0, options.top_k - 1);
    scores = scores.masked_fill(scores < kth, kMinusInfinity);
  }
  if (options.top_p < 1.0) {
    // Ascending, as HF sorts: drop the low tail whose mass is at most 1 - top_p, keeping the
    // most likely token always.
    const auto [sorted, order] = scores.sort(/*stable=*/false, /*dim=*/0, /*descending=*/false);
    const at::Tensor cumulative = sorted.softmax(0).cumsum(0);
    at::Tensor drop_sorted = cumulative <= (1.0 - options.top_p);
    drop_sorted[vocab - 1] = false;
    const at::Tensor drop = drop_sorted.scatter(0, order, drop_sorted);
    scores = scores.masked_fill(drop, kMinusInfinity);
  }
  return scores;
}

TokenChooser::TokenChooser(SamplingOptions options)
    : options_(options), generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {}

int64_t TokenChooser::Choose(const at::Tensor& logits, const std::vector<int64_t>& context,
                             const std::vector<int64_t>& banned) {
  const at::Tensor scores = ProcessedScores(logits, context, options_, banned);
  if (!options_.do_sample) return scores.argmax().item<int64_t>();
  return at::multinomial(scores.softmax(0), 1, /*replacement=*/false, generator_).item<int64_t>();
}

}  // namespace qlora::engine
