// Text generation with a trained model: the prompt run once through the decoder (filling a KV
// cache), then one token at a time, each chosen as transformers' generate chooses it
// (token_choice.h), until an end-of-sequence token, max_new_tokens, or the caller says stop.
// One prompt at a time (batch 1), so no padding changes what a prompt generates.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/token_choice.h"

namespace qlora::engine {

struct GenerationOptions {
  SamplingOptions sampling;
  int64_t max_new_tokens = 256;
  int64_t min_new_tokens = 0;            // end-of-sequence ids banned before this many
  std::vector<int64_t> eos_token_ids;    // generation ends after any of them (kept in the output)
};

enum class GenerationEnd { kEndOfSequence, kMaxNewTokens, kStoppedByCaller, kContextFull };

struct GenerationResult {
  std::vector<int64_t> tokens;  // the new tokens only
  GenerationEnd end = GenerationEnd::kMaxNewTokens;
};

// Called with each new token as soon as it is chosen; returning false ends the generation
// after it (stop strings, a cancelled stream).
using TokenCallback = std::function<bool(int64_t token)>;

// InvalidArgument for an empty prompt, a token outside the vocabulary or options out of range.
// The prompt and the new tokens together are capped at the model's max_position_embeddings
// (GenerationEnd::kContextFull when that ends it).
absl::StatusOr<GenerationResult> Generate(const LlamaForCausalLM& model,
                                          const std::vector<int64_t>& prompt,
                                          const GenerationOptions& options,
                                          const TokenCallback& on_token = nullptr);

}  // namespace qlora::engine
