// Preference pairs (trainer.type dpo or orpo) as token ids, tokenized as TRL's DPOTrainer does
// (trl/trainer/dpo_trainer.py, 1.16: _prepare_dataset and DataCollatorForPreference):
//
//  - strings: prompt_ids = [BOS] + enc(prompt); each side = [BOS] + enc(prompt + completion) +
//    [EOS]. TRL appends the EOS token's text unless the completion ends with it; here EOS is
//    added by id (the same ids where the tokenizer maps that text to its id, and right for
//    SentencePiece, which tokenizes special-token text as text).
//  - conversations (JSON arrays of {role, content} or ShareGPT {from, value} turns):
//    prompt_ids = the tokenizer's chat template over the prompt turns with the generation
//    prompt; each side = the template over prompt + completion turns (no EOS added: the
//    template ends the turn). Without a prompt column, the turns both sides share from the start
//    are the prompt (TRL's extract_prompt).
//
// The completion starts where the prompt's ids and both sides' ids first differ (TRL's
// common_prefix_length: a token merged across the boundary belongs to the completion). Labels
// are -100 over the prompt. Each sequence keeps its first max_sequence_length tokens (TRL's
// keep_start truncation); a pair whose prompt alone fills max_sequence_length trains nothing and
// is dropped, as TRL drops it. ORPO uses the same ids (TRL's ORPOTrainer tokenizes the same
// sequences for these layouts; docs/preference.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/record.h"
#include "common/dataset/record_layout.h"
#include "worker/data/example_builder.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

class ChatTemplate;
struct ChatTemplateTokens;

struct PreferenceTokenization {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: conversations are refused
  const ChatTemplateTokens* chat_tokens = nullptr;
};

struct PreferenceBuild {
  bool kept = false;       // false: the prompt fills max_sequence_length
  bool truncated = false;  // a side was cut to max_sequence_length
};

// The pair of `record` (options: the preference layout's columns) into example->input_ids /
// labels (chosen) and rejected_input_ids / rejected_labels. INVALID_ARGUMENT names what is wrong
// with the record (a missing column, a conversation without a common prompt, a string prompt
// with conversational completions).
absl::StatusOr<PreferenceBuild> BuildPreferencePair(const PreferenceTokenization& t,
                                                    const ExampleOptions& options,
                                                    const Record& record, Example* example);

// The ids a model is prompted with for `prompt` (a string, or a conversation ending with a user
// turn), laid out as the pairs' prompts are.
absl::StatusOr<std::vector<int32_t>> PreferencePromptIds(const PreferenceTokenization& t,
                                                         const std::string& prompt);

}  // namespace qlora::data
