// A generation session on a worker (`qlora-worker --generate`): loads the job's base model as it
// trained (4-bit, its compute dtype) with a trained adapter, lays out each prompt as the job laid
// out its records (generation_prompt.h), generates (engine/generation.h) and hands the text on
// in pieces as it comes, prompt after prompt.
//
// The decoding settings, each taken from the first that sets it: the request, the job file's
// `generation:` section, the base model's generation_config.json, then HF's GenerationConfig
// defaults (greedy; top_k 50 when sampling), with max_new_tokens 256 by default. Generation ends
// at any of the model's end-of-sequence ids (generation_config.json's list, else config.json's),
// plus, under a chat layout, the tokenizer's end of turn (LLaMA-3's <|eot_id|>).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "worker/data/tokenizer.h"
#include "worker/engine/generation.h"
#include "worker/run/generation_request.h"

namespace qlora::worker {

// The ids generation ends at: the model's end of sequence (config.json), the tokenizer's, and
// with `end_of_turn` LLaMA-3's end of turn where the tokenizer has it (a chat-trained model ends
// its answers so).
std::vector<int64_t> EndOfSequenceIds(const engine::LlamaConfig& config, const data::Tokenizer& tokenizer,
                                      bool end_of_turn);

// The engine's options for `job` with `request`'s settings on top (see the file comment).
// INVALID_ARGUMENT for num_beams > 1 (no beam search) or settings out of range.
absl::StatusOr<engine::GenerationOptions> ResolveGenerationOptions(const GenerationRequest& request,
                                                                   const std::vector<int64_t>& eos_ids);


}  // namespace qlora::worker
