// Prompt templates, chat layout, masking and truncation (see example_builder.h).
#include "worker/data/example_builder.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/chat_example.h"
#include "worker/data/preference_example.h"

namespace qlora::data {
namespace {

std::string Title(absl::string_view column) {
  std::string title(column);
  for (char& c : title)
    if (c == '_') c = ' ';
  if (!title.empty()) title[0] = absl::ascii_toupper(title[0]);
  return title;
}

}  // namespace

absl::StatusOr<ExampleOptions> ExampleBuilder::OptionsFor(
    DataFormat format, const std::vector<std::string>& input_columns,
    const std::vector<std::string>& output_columns, const std::string& prompt_template,
    int max_sequence_length) {
  return LayoutForJob(format, input_columns, output_columns, prompt_template, max_sequence_length);
}

absl::StatusOr<ExampleBuilder> ExampleBuilder::Create(const ExampleOptions& options,
                                                      const Tokenizer* tokenizer) {
  if (tokenizer->special().eos_id < 0)
    return absl::FailedPreconditionError(
        "the tokenizer has no EOS token (set eos_token in tokenizer_config.json)");
  ExampleBuilder builder(options, tokenizer);
  const ChatConfig& chat = tokenizer->chat_config();
  if (options.layout == ExampleLayout::kPreference) {
    if (!chat.chat_template.empty()) {  // for conversational pairs
      absl::StatusOr<ChatTemplate> compiled = ChatTemplate::Compile(chat.chat_template);
      if (!compiled.ok())
        return absl::Status(compiled.status().code(),
                            absl::StrCat("tokenizer_config.json: ", compiled.status().message()));
      builder.chat_template_ = std::make_shared<const ChatTemplate>(std::move(*compiled));
      builder.chat_tokens_ = std::make_shared<const ChatTemplateTokens>(
          ChatTemplateTokens{chat.bos_token, chat.eos_token, chat.pad_token});
    }
    return builder;
  }
  if (options.layout == ExampleLayout::kChat && options.use_tokenizer_chat_template &&
      !chat.chat_template.empty()) {
    absl::StatusOr<ChatTemplate> compiled = ChatTemplate::Compile(chat.chat_template);
    if (!compiled.ok())
      return absl::Status(compiled.status().code(),
                          absl::StrCat("tokenizer_config.json: ", compiled.status().message()));
    if (tokenizer->special().eos_id >= 0 && !tokenizer->TokenText(tokenizer->special().eos_id))
      return absl::FailedPreconditionError(absl::StrCat(
          "the tokenizer's chat_template needs a tokenizer.json tokenizer (", tokenizer->kind(),
          " cannot map tokens back to the rendered text); set data.prompt_template: llama3_chat "
          "for the built-in LLaMA-3 layout"));
    builder.chat_template_ = std::make_shared<const ChatTemplate>(std::move(*compiled));
    builder.chat_tokens_ = std::make_shared<const ChatTemplateTokens>(
        ChatTemplateTokens{chat.bos_token, chat.eos_token, chat.pad_token});
    return builder;
  }
  if (options.layout == ExampleLayout::kChat) {
    builder.start_header_id_ = tokenizer->TokenToId("<|start_header_id|>");
    builder.end_header_id_ = tokenizer->TokenToId("<|end_header_id|>");
    builder.eot_id_ = tokenizer->TokenToId("<|eot_id|>");
    if (builder.start_header_id_ < 0 || builder.end_header_id_ < 0 || builder.eot_id_ < 0)
      return absl::FailedPreconditionError(
          "the messages (LLaMA-3 chat) layout needs <|start_header_id|>, <|end_header_id|> and "
          "<|eot_id|> in the tokenizer");
  }
  if (options.layout != ExampleLayout::kInstruction) return builder;

  if (options.prompt_template.empty()) {
    for (size_t i = 0; i < options.input_columns.size(); ++i) {
      const std::string& column = options.input_columns[i];
      Section section;
      section.pieces = {{false, absl::StrCat("### ", i == 0 ? "Instruction" : Title(column), ":\n")},
                        {true, column},
                        {false, "\n\n"}};
      if (i > 0) section.optional_column = column;
      builder.sections_.push_back(std::move(section));
    }
    builder.sections_.push_back({{{false, "### Response:\n"}}, ""});
    return builder;
  }
  // A user template: one section of literal and {column} pieces.
  QLORA_ASSIGN_OR_RETURN(const std::vector<TemplatePiece> pieces, ParsePromptTemplate(options.prompt_template));
  Section section;
  for (const TemplatePiece& piece : pieces) section.pieces.push_back({piece.is_column, piece.text});
  builder.sections_.push_back(std::move(section));
  return builder;
}

void ExampleBuilder::Columns(std::vector<std::string>* required,
                             std::vector<std::string>* optional) const {
  // Create parsed the template already: the columns cannot fail here.
  ColumnsOfLayout(options_, required, optional).IgnoreError();
}

absl::Status ExampleBuilder::Append(absl::string_view text, bool train, Example* example) const {
  const size_t before = example->input_ids.size();
  QLORA_RETURN_IF_ERROR(tokenizer_->EncodeTo(text, &example->input_ids));
  for (size_t i = before; i < example->input_ids.size(); ++i)
    example->labels.push_back(train ? example->input_ids[i] : kIgnoreIndex);
  return absl::OkStatus();
}

absl::Status ExampleBuilder::BuildInstruction(const Record& record, Example* example) const {
  std::string prompt;
  for (const Section& section : sections_) {
    if (!section.optional_column.empty()) {
      const std::string* value = record.Find(section.optional_column);
      if (value == nullptr || value->empty()) continue;
    }
    for (const Piece& piece : section.pieces) {
      if (!piece.is_column) {
        prompt += piece.text;
        continue;
      }
      const std::string* value = record.Find(piece.text);
      if (value == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing column '", piece.text, "'"));
      prompt += *value;
    }
  }
  const std::string* target = record.Find(options_.output_column);
  if (target == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("missing column '", options_.output_column, "'"));
  const SpecialTokens& special = tokenizer_->special();
  if (special.add_bos) {
    example->input_ids.push_back(special.bos_id);
    example->labels.push_back(kIgnoreIndex);
  }
  QLORA_RETURN_IF_ERROR(Append(prompt, false, example));
  QLORA_RETURN_IF_ERROR(Append(*target, true, example));
  example->input_ids.push_back(special.eos_id);
  example->labels.push_back(special.eos_id);
  return absl::OkStatus();
}

absl::Status ExampleBuilder::BuildChat(const Record& record, Example* example) const {
  const std::string& column = options_.input_columns[0];
  const std::string* column_text = record.Find(column);
  if (column_text == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing column '", column, "'"));
  QLORA_ASSIGN_OR_RETURN(const std::string messages_text, ChatMessages(column, *column_text));
  if (chat_template_ != nullptr)
    return BuildTemplateChat(*chat_template_, *chat_tokens_, *tokenizer_, messages_text, example);
  nlohmann::json messages = nlohmann::json::parse(messages_text, nullptr, false);
  if (!messages.is_array())
    return absl::InvalidArgumentError("'messages' must be a JSON array of {role, content}");
  const SpecialTokens& special = tokenizer_->special();
  if (special.bos_id >= 0) {  // the LLaMA-3 template writes bos_token itself
    example->input_ids.push_back(special.bos_id);
    example->labels.push_back(kIgnoreIndex);
  }
  auto push = [&](int32_t id, bool train) {
    example->input_ids.push_back(id);
    example->labels.push_back(train ? id : kIgnoreIndex);
  };
  for (const nlohmann::json& message : messages) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string() ||
        !message.contains("content") || !message["content"].is_string())
      return absl::InvalidArgumentError("each message must be {\"role\": str, \"content\": str}");
    const std::string role = message["role"].get<std::string>();
    const bool train = role == "assistant";
    push(start_header_id_, false);
    QLORA_RETURN_IF_ERROR(Append(role, false, example));
    push(end_header_id_, false);
    QLORA_RETURN_IF_ERROR(Append("\n\n", false, example));
    QLORA_RETURN_IF_ERROR(Append(
        absl::StripAsciiWhitespace(message["content"].get_ref<const std::string&>()), train,
        example));
    push(eot_id_, train);
  }
  return absl::OkStatus();
}

absl::Status ExampleBuilder::BuildText(const Record& record, Example* example) const {
  const std::string& column = options_.input_columns[0];
  const std::string* text = record.Find(column);
  if (text == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing column '", column, "'"));
  const SpecialTokens& special = tokenizer_->special();
  if (special.add_bos) {
    example->input_ids.push_back(special.bos_id);
    example->labels.push_back(kIgnoreIndex);
  }
  QLORA_RETURN_IF_ERROR(Append(*text, true, example));
  example->input_ids.push_back(special.eos_id);
  example->labels.push_back(special.eos_id);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ExampleBuilder::PreferencePrompt(const std::string& prompt) const {
  PreferenceTokenization t;
  t.tokenizer = tokenizer_;
  t.chat_template = chat_template_.get();
  t.chat_tokens = chat_tokens_.get();
  return PreferencePromptIds(t, prompt);
}

absl::StatusOr<bool> ExampleBuilder::BuildPreference(const Record& record, Example* example) {
  PreferenceTokenization t;
  t.tokenizer = tokenizer_;
  t.chat_template = chat_template_.get();
  t.chat_tokens = chat_tokens_.get();
  QLORA_ASSIGN_OR_RETURN(const PreferenceBuild build, BuildPreferencePair(t, options_, record, example));
  if (!build.kept) {
    ++stats_.dropped_no_target;
    return false;
  }
  stats_.truncated += build.truncated;
  ++stats_.examples;
  return true;
}

absl::StatusOr<bool> ExampleBuilder::Build(const Record& record, Example* example) {
  example->input_ids.clear();
  example->labels.clear();
  example->rejected_input_ids.clear();
  example->rejected_labels.clear();
  switch (options_.layout) {
    case ExampleLayout::kPreference: return BuildPreference(record, example);
    case ExampleLayout::kInstruction: QLORA_RETURN_IF_ERROR(BuildInstruction(record, example)); break;
    case ExampleLayout::kChat: QLORA_RETURN_IF_ERROR(BuildChat(record, example)); break;
    case ExampleLayout::kText: QLORA_RETURN_IF_ERROR(BuildText(record, example)); break;
  }
  const size_t max = static_cast<size_t>(options_.max_sequence_length);
  if (example->input_ids.size() > max) {
    example->input_ids.resize(max);
    example->labels.resize(max);
    ++stats_.truncated;
  }
  bool any_label = false;
  for (int32_t label : example->labels) any_label |= label != kIgnoreIndex;
  if (!any_label) {
    ++stats_.dropped_no_target;
    return false;
  }
  ++stats_.examples;
  return true;
}

}  // namespace qlora::data
