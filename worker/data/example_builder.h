// Turns one record into one training example: token ids and labels (-100 where no loss).
//
// Layouts:
//  - Instruction (default): prompt = the template filled from the record's columns; target =
//    the output column. input_ids = [BOS if the tokenizer adds it] + enc(prompt) +
//    enc(target) + [EOS]; labels = -100 over BOS and the prompt, the ids over target and EOS.
//    Prompt and target are encoded separately (as the QLoRA collator does), so the boundary
//    is never merged into one token. Template: text with {column} placeholders ("{{" and "}}"
//    are literal braces). Default for input columns c1..cn: "### Instruction:\n{c1}\n\n" then
//    "### <C>:\n{c}\n\n" for each further column c (a section whose value is empty is left
//    out, as Alpaca does for an empty input), then "### Response:\n".
//  - Chat (a "messages" column holding [{"role", "content"}, ...]; selected when it is the only
//    input feature or the template is "llama3_chat"; or ShareGPT's "conversations" column,
//    [{"from", "value"}, ...], as the only input feature, whose speakers are mapped to roles as
//    LLaMA-Factory and Axolotl map them: human/user -> user, gpt/assistant/model/chatgpt/bard/
//    bing -> assistant, system -> system, observation/tool/function_response -> tool,
//    function_call -> assistant; either column may use either spelling): when the tokenizer has a chat template
//    (tokenizer_config.json) and the template is not "llama3_chat", the conversation rendered by
//    that template, ids as transformers' apply_chat_template, loss on the assistant spans
//    (chat_example.h). Otherwise the built-in LLaMA-3 instruct layout: BOS, then per message
//    "<|start_header_id|>" role "<|end_header_id|>\n\n" content.strip() "<|eot_id|>"; loss
//    only on assistant content and its <|eot_id|>. Needs a tokenizer with those tokens.
//  - Text (format text, or no output column): [BOS] + enc(text) + [EOS], loss on every token.
//  - Preference (trainer.type dpo or orpo): a pair of sequences, prompt + chosen and prompt +
//    rejected, tokenized as TRL's DPOTrainer does (preference_example.h).
//
// Truncation to max_sequence_length cuts the tail (the end of the target and its EOS go
// first), as HF/TRL truncate. An example left without any label (the prompt filled the window)
// is dropped and counted (stats().dropped_no_target), never trained on silently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/record.h"
#include "common/dataset/record_layout.h"  // ExampleLayout, ExampleOptions
#include "worker/data/tokenizer.h"

namespace qlora::data {

class ChatTemplate;         // chat_template/chat_template.h
struct ChatTemplateTokens;

constexpr int32_t kIgnoreIndex = -100;

struct Example {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length; kIgnoreIndex where no loss
  // A preference pair (preference layout): input_ids/labels are the prompt and the chosen
  // completion, these the prompt and the rejected one (labels on the completion only); empty
  // for every other layout.
  std::vector<int32_t> rejected_input_ids;
  std::vector<int32_t> rejected_labels;
};

struct ExampleStats {
  int64_t examples = 0;
  int64_t truncated = 0;
  int64_t dropped_no_target = 0;
};

class ExampleBuilder {
 public:
  // Chooses the layout from the job's data section and features (LayoutForJob).
  static absl::StatusOr<ExampleOptions> OptionsFor(DataFormat format,
                                                   const std::vector<std::string>& input_columns,
                                                   const std::vector<std::string>& output_columns,
                                                   const std::string& prompt_template,
                                                   int max_sequence_length);

  static absl::StatusOr<ExampleBuilder> Create(const ExampleOptions& options,
                                               const Tokenizer* tokenizer);

  // Builds the example of `record` into *example; false when it was dropped (no label left).
  // An error is a malformed record (missing column, bad messages): its message is the reason,
  // without file and line (the caller adds them and applies the malformed-record policy).
  absl::StatusOr<bool> Build(const Record& record, Example* example);

  // The columns Build reads: those it needs, and those it uses when present (the default
  // template's further input columns). Parquet reads only these (ReaderOptions::columns).
  void Columns(std::vector<std::string>* required, std::vector<std::string>* optional) const;

  // Preference layout: the ids a prompt (a string, or a conversation's JSON) is laid out as
  // when it prompts the trained model (preference_example.h: PreferencePromptIds).
  absl::StatusOr<std::vector<int32_t>> PreferencePrompt(const std::string& prompt) const;

  const ExampleStats& stats() const { return stats_; }
  void ResetStats() { stats_ = ExampleStats(); }

 private:
  struct Piece {
    bool is_column;
    std::string text;  // literal text or column name
  };
  struct Section {  // default template: a section disappears when its column is empty
    std::vector<Piece> pieces;
    std::string optional_column;
  };

  ExampleBuilder(ExampleOptions options, const Tokenizer* tokenizer)
      : options_(std::move(options)), tokenizer_(tokenizer) {}
  absl::Status BuildInstruction(const Record& record, Example* example) const;
  absl::Status BuildChat(const Record& record, Example* example) const;
  absl::Status BuildText(const Record& record, Example* example) const;
  // False when the pair was dropped (the prompt fills max_sequence_length).
  absl::StatusOr<bool> BuildPreference(const Record& record, Example* example);
  absl::Status Append(absl::string_view text, bool train, Example* example) const;

  ExampleOptions options_;
  const Tokenizer* tokenizer_;
  std::vector<Section> sections_;
  int32_t start_header_id_ = -1, end_header_id_ = -1, eot_id_ = -1;  // chat tokens
  std::shared_ptr<const ChatTemplate> chat_template_;  // the tokenizer's, when used
  std::shared_ptr<const ChatTemplateTokens> chat_tokens_;
  ExampleStats stats_;
};

}  // namespace qlora::data
