// The tokens a trained model is prompted with: a user's prompt laid out exactly as the job laid
// out its training records (its template, the tokenizer's chat template or the LLaMA-3 layout,
// or plain text), ending where the trained target began, so the model continues where it
// learnt to answer.
//
// A prompt is plain text, which fills the job's only input column (instruction layout), the
// user turn (chat layouts) or the text column; or a JSON object, whose keys give the template's
// columns (a template with several input columns), or, under a chat layout, whose `messages`
// (or ShareGPT `conversations`) is the conversation so far, ending with a user turn. A preference
// job (dpo, orpo) lays a prompt out as its pairs' prompts: the text, or under a chat template
// the conversation with the generation prompt.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "worker/data/example_builder.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

class GenerationPrompts {
 public:
  // The job's layout with `tokenizer` (which outlives this). INVALID_ARGUMENT as the job's data
  // options would give it.
  static absl::StatusOr<GenerationPrompts> ForJob(const JobConfig& job, const Tokenizer* tokenizer,
                                                  int max_prompt_tokens);

  // The token ids of `prompt`; INVALID_ARGUMENT naming what is wrong with it (a JSON object
  // missing a column of the template, a conversation not ending with a user turn).
  absl::StatusOr<std::vector<int32_t>> Ids(const std::string& prompt);
  // The prompt of a training or validation record: every token before its first trained one
  // (its target, or its first assistant reply); under the text layout, its first half (at most
  // 32 tokens). INVALID_ARGUMENT for a record the layout cannot build.
  absl::StatusOr<std::vector<int32_t>> IdsOfRecord(const Record& record);

  // The first `count` records of the job's validation file, else of its training file, read as
  // the job reads them (format, columns); fewer when the file has fewer.
  static absl::StatusOr<std::vector<Record>> FirstRecords(const JobConfig& job, const Tokenizer& tokenizer,
                                                          int64_t count);

  ExampleLayout layout() const { return options_.layout; }

 private:
  GenerationPrompts(ExampleOptions options, std::shared_ptr<ExampleBuilder> builder)
      : options_(std::move(options)), builder_(std::move(builder)) {}
  absl::StatusOr<Record> PromptRecord(const std::string& prompt) const;
  // A preference job's prompt: as its pairs' prompts are laid out.
  absl::StatusOr<std::vector<int32_t>> PreferenceIds(const std::string& prompt) const;

  ExampleOptions options_;
  std::shared_ptr<ExampleBuilder> builder_;
};

}  // namespace qlora::data
