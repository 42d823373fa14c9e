// Generate: prefill, then one cached decoder step per new token.
#include "worker/engine/generation.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qlora::engine {
namespace {

absl::Status CheckOptions(const LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                          const GenerationOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  const int64_t vocab = model.config().vocab_size;
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", id, " is outside the vocabulary of ", vocab));
    }
  }
  const SamplingOptions& s = options.sampling;
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError("max_new_tokens must be at least 1");
  }
  if (options.min_new_tokens < 0) {
    return absl::InvalidArgumentError("min_new_tokens must not be negative");
  }
  // As transformers: temperature only shapes sampling, so greedy decoding takes 0 (Ludwig-style
  // files write it); sampling at 0 would divide by zero.
  if (!(s.temperature >= 0)) return absl::InvalidArgumentError("temperature must not be negative");
  if (s.do_sample && s.temperature == 0) {
    return absl::InvalidArgumentError(
        "temperature 0 with do_sample: sampling needs a temperature above 0 (greedy: do_sample false)");
  }
  if (s.top_k < 0) return absl::InvalidArgumentError("top_k must not be negative");
  if (!(s.top_p > 0 && s.top_p <= 1)) return absl::InvalidArgumentError("top_p must be in (0, 1]");
  if (!(s.repetition_penalty > 0)) {
    return absl::InvalidArgumentError("repetition_penalty must be above 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerationResult> Generate(const LlamaForCausalLM& model,
                                          const std::vector<int64_t>& prompt,
                                          const GenerationOptions& options,
                                          const TokenCallback& on_token) {
  if (absl::Status status = CheckOptions(model, prompt, options); !status.ok()) return status;
  const int64_t context = model.config().max_position_embeddings;
  const int64_t prompt_length = static_cast<int64_t>(prompt.size());
  if (prompt_length >= context) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt's ", prompt_length,
                                                   " tokens leave no room in the model's context of ",
                                                   context));
  }
  const int64_t most_new = std::min(options.max_new_tokens, context - prompt_length);
  at::NoGradGuard no_grad;
  KvCache cache = model.NewKvCache(1, prompt_length + most_new);
  TokenChooser chooser(options.sampling);
  std::vector<int64_t> sequence = prompt;
  GenerationResult result;
  const std::vector<int64_t> no_ban;
  at::Tensor input = at::tensor(prompt, at::kLong).view({1, -1});
  for (int64_t step = 0; step < most_new; ++step) {
    const at::Tensor hidden = model.ForwardCached(input, &cache);
    const at::Tensor logits = model.Logits(hidden.select(1, hidden.size(1) - 1)).select(0, 0);
    const std::vector<int64_t>& banned =
        step < options.min_new_tokens ? options.eos_token_ids : no_ban;
    const int64_t token = chooser.Choose(logits, sequence, banned);
    sequence.push_back(token);
    result.tokens.push_back(token);
    const bool go_on = on_token == nullptr || on_token(token);
    if (std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(), token) !=
        options.eos_token_ids.end()) {
      result.end = GenerationEnd::kEndOfSequence;
      return result;
    }
    if (!go_on) {
      result.end = GenerationEnd::kStoppedByCaller;
      return result;
    }
    input = at::tensor(std::vector<int64_t>{token}, at::kLong).view({1, 1});
  }
  result.end = most_new < options.max_new_tokens ? GenerationEnd::kContextFull
                                                 : GenerationEnd::kMaxNewTokens;
  return result;
}

}  // namespace qlora::engine
