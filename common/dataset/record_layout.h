// Which columns of a record a job reads, and in what layout (worker/data/example_builder.h says
// how each layout becomes tokens): decided from the job's features, format and prompt template
// alone, without a tokenizer, so that the coordinator checks a dataset's first records with the
// rules the workers build examples by.
//
//  - text: the `text` column of a text file, or the one input column when there is no output;
//  - chat: a `messages` column (the only input, or template `llama3_chat`), or ShareGPT's
//    `conversations` column (the only input);
//  - instruction: the prompt template's {column} placeholders (`{{`/`}}` are braces), or by
//    default the first input column then the others when present; and the output column;
//  - preference (trainer.type dpo or orpo): a prompt and a chosen and a rejected completion, as
//    TRL defines preference data: strings, or conversations (JSON arrays of turns) rendered by
//    the tokenizer's chat template; without a prompt column, conversations whose common first
//    turns are the prompt (TRL's implicit prompt).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/record.h"

namespace qlora::data {

enum class ExampleLayout { kInstruction, kChat, kText, kPreference };

inline constexpr char kLlama3ChatTemplateName[] = "llama3_chat";  // data.prompt_template

struct ExampleOptions {
  ExampleLayout layout = ExampleLayout::kInstruction;
  std::vector<std::string> input_columns;  // input_features names
  std::string output_column;               // output_features[0].name (instruction layout;
                                           // preference: the chosen column)
  std::string rejected_column;             // preference: output_features[1].name
  std::string prompt_template;             // "" = the default layout
  int max_sequence_length = 512;
  // Chat layout: render the tokenizer's chat template when it has one (false for
  // prompt_template "llama3_chat", which forces the built-in layout).
  bool use_tokenizer_chat_template = true;
};

// The layout and columns for a job's format, features and template (see the file comment).
absl::StatusOr<ExampleOptions> LayoutForJob(DataFormat format, const std::vector<std::string>& input_columns,
                                            const std::vector<std::string>& output_columns,
                                            const std::string& prompt_template, int max_sequence_length);

// A preference job's layout: input_columns = {the prompt column}, output_columns = {chosen,
// rejected}. INVALID_ARGUMENT for a text file (it has no such columns).
absl::StatusOr<ExampleOptions> PreferenceLayout(DataFormat format, const std::vector<std::string>& input_columns,
                                                const std::vector<std::string>& output_columns,
                                                int max_sequence_length);

// A prompt template as literal text and {column} pieces; INVALID_ARGUMENT naming the offset of
// a '{' that opens no placeholder or an unmatched '}'.
struct TemplatePiece {
  bool is_column = false;
  std::string text;  // the literal text, or the column's name
};
absl::StatusOr<std::vector<TemplatePiece>> ParsePromptTemplate(const std::string& text);

// The columns every record must have, and those read when present (the default template's
// further input columns), in first-use order.
absl::Status ColumnsOfLayout(const ExampleOptions& options, std::vector<std::string>* required,
                             std::vector<std::string>* optional);

// What keeps `record` from the layout, or "": a `required` column it lacks ("missing column
// 'instrucion'; did you mean 'instruction'? (the record has: instruction, output)"), or a chat
// column that is not a JSON array of turns.
std::string RecordLayoutProblem(const Record& record, const ExampleOptions& layout,
                                const std::vector<std::string>& required);

// The verdict on a sample of a dataset's first records (the coordinator's check at submit,
// `qloractl validate`): under malformed_records: fail, the first record with a problem fails
// the sample; under skip, a sample in which records had problems and none was usable (a
// misspelled column trains nothing).
class SampleVerdict {
 public:
  explicit SampleVerdict(bool skip_malformed) : skip_malformed_(skip_malformed) {}
  // A record, named `where` (file:line), and its problem ("" when usable): INVALID_ARGUMENT
  // "<where>: <problem>" under fail.
  absl::Status Add(const std::string& where, const std::string& problem);
  // INVALID_ARGUMENT "no sampled record has what the job reads (...): <the first problem>".
  absl::Status Final() const;

 private:
  bool skip_malformed_;
  bool any_usable_ = false;
  std::string first_problem_;
};

}  // namespace qlora::data
