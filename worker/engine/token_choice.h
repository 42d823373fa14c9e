// How the next token is chosen from a step's logits, as transformers' generate chooses it: the
// logits processors in its order (repetition penalty, then the end-of-sequence ban before
// min_new_tokens), then greedy argmax, or with do_sample the warpers (temperature, top-k,
// top-p) and one draw from the softmax. The draw uses the chooser's own CPU generator, seeded
// once, so a seed gives the same tokens on every device and run.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace qlora::engine {

// The decoding knobs of HF's GenerationConfig (their defaults too).
struct SamplingOptions {
  bool do_sample = false;
  double temperature = 1.0;          // > 0; 1 leaves the logits as they are
  int64_t top_k = 50;                // 0: off
  double top_p = 1.0;                // in (0, 1]; 1: off
  double repetition_penalty = 1.0;   // > 0; 1: off (also applies to greedy decoding)
  uint64_t seed = 0;
};

// The processed scores [vocab] (float32, -inf where a token is ruled out) for `logits` [vocab]
// after `context` (the prompt and the tokens generated so far): what HF's logits processor
// list gives before its argmax or softmax. `banned` tokens (the end-of-sequence ids before
// min_new_tokens) get -inf first.
at::Tensor ProcessedScores(const at::Tensor& logits, const std::vector<int64_t>& context,
                           const SamplingOptions& options, const std::vector<int64_t>& banned);

class TokenChooser {
 public:
  explicit TokenChooser(SamplingOptions options);
  int64_t Choose(const at::Tensor& logits, const std::vector<int64_t>& context,
                 const std::vector<int64_t>& banned);

 private:
  SamplingOptions options_;
  at::Generator generator_;
};

}  // namespace qlora::engine
