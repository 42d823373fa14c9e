// A job's example layout and the columns it reads (see record_layout.h).
#include "common/dataset/record_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config_schema.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace qlora::data {
namespace {

constexpr char kShareGptColumn[] = "conversations";

void AddOnce(std::vector<std::string>* to, const std::string& column) {
  if (std::find(to->begin(), to->end(), column) == to->end()) to->push_back(column);
}

}  // namespace

absl::StatusOr<ExampleOptions> LayoutForJob(DataFormat format, const std::vector<std::string>& input_columns,
                                            const std::vector<std::string>& output_columns,
                                            const std::string& prompt_template, int max_sequence_length) {
  ExampleOptions options;
  options.max_sequence_length = max_sequence_length;
  options.prompt_template = prompt_template;
  options.input_columns = input_columns;
  if (max_sequence_length < 2)
    return absl::InvalidArgumentError("data.max_sequence_length must be at least 2");
  if (format == DataFormat::kText) {
    options.layout = ExampleLayout::kText;
    options.input_columns = {"text"};
  } else if (input_columns.size() == 1 && input_columns[0] == kShareGptColumn) {
    options.layout = ExampleLayout::kChat;
    options.use_tokenizer_chat_template = prompt_template != kLlama3ChatTemplateName;
  } else if (prompt_template == kLlama3ChatTemplateName ||
             (input_columns.size() == 1 && input_columns[0] == "messages")) {
    options.layout = ExampleLayout::kChat;
    options.input_columns = {"messages"};
    options.use_tokenizer_chat_template = prompt_template != kLlama3ChatTemplateName;
  } else if (output_columns.empty()) {
    if (input_columns.empty())
      return absl::InvalidArgumentError("input_features: at least one column is needed");
    options.layout = ExampleLayout::kText;
  } else {
    if (output_columns.size() > 1)
      return absl::InvalidArgumentError("output_features: exactly one text column is supported");
    if (input_columns.empty())
      return absl::InvalidArgumentError("input_features: at least one column is needed");
    options.layout = ExampleLayout::kInstruction;
    options.output_column = output_columns[0];
  }
  return options;
}

absl::StatusOr<ExampleOptions> PreferenceLayout(DataFormat format, const std::vector<std::string>& input_columns,
                                                const std::vector<std::string>& output_columns,
                                                int max_sequence_length) {
  if (format == DataFormat::kText) {
    return absl::InvalidArgumentError(
        "preference tuning reads prompt, chosen and rejected columns; a text file has none "
        "(use JSONL, CSV or Parquet)");
  }
  if (input_columns.size() != 1 || output_columns.size() != 2) {
    return absl::InvalidArgumentError(
        "preference data needs one prompt column and the chosen and rejected columns");
  }
  if (max_sequence_length < 2)
    return absl::InvalidArgumentError("data.max_sequence_length must be at least 2");
  ExampleOptions options;
  options.layout = ExampleLayout::kPreference;
  options.max_sequence_length = max_sequence_length;
  options.input_columns = input_columns;
  options.output_column = output_columns[0];
  options.rejected_column = output_columns[1];
  return options;
}

absl::StatusOr<std::vector<TemplatePiece>> ParsePromptTemplate(const std::string& text) {
  std::vector<TemplatePiece> pieces;
  std::string literal;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((text[i] == '{' || text[i] == '}') && i + 1 < text.size() && text[i + 1] == text[i]) {
      literal.push_back(text[i++]);
    } else if (text[i] == '{') {
      size_t close = text.find('}', i);
      if (close == std::string::npos || close == i + 1)
        return absl::InvalidArgumentError(absl::StrCat(
            "data.prompt_template: '{' at offset ", i, " does not open a {column} placeholder"));
      if (!literal.empty()) pieces.push_back({false, std::move(literal)});
      literal.clear();
      pieces.push_back({true, text.substr(i + 1, close - i - 1)});
      i = close;
    } else if (text[i] == '}') {
      return absl::InvalidArgumentError(
          absl::StrCat("data.prompt_template: unmatched '}' at offset ", i, " (write '}}')"));
    } else {
      literal.push_back(text[i]);
    }
  }
  if (!literal.empty()) pieces.push_back({false, std::move(literal)});
  return pieces;
}

absl::Status ColumnsOfLayout(const ExampleOptions& options, std::vector<std::string>* required,
                             std::vector<std::string>* optional) {
  switch (options.layout) {
    case ExampleLayout::kChat:
    case ExampleLayout::kText:
      AddOnce(required, options.input_columns[0]);
      return absl::OkStatus();
    case ExampleLayout::kPreference:  // the prompt may be implicit in conversations
      AddOnce(optional, options.input_columns[0]);
      AddOnce(required, options.output_column);
      AddOnce(required, options.rejected_column);
      return absl::OkStatus();
    case ExampleLayout::kInstruction:
      break;
  }
  if (options.prompt_template.empty()) {
    for (size_t i = 0; i < options.input_columns.size(); ++i) {
      AddOnce(i == 0 ? required : optional, options.input_columns[i]);
    }
  } else {
    QLORA_ASSIGN_OR_RETURN(const std::vector<TemplatePiece> pieces, ParsePromptTemplate(options.prompt_template));
    for (const TemplatePiece& piece : pieces) {
      if (piece.is_column) AddOnce(required, piece.text);
    }
  }
  AddOnce(required, options.output_column);
  return absl::OkStatus();
}

std::string RecordLayoutProblem(const Record& record, const ExampleOptions& layout,
                                const std::vector<std::string>& required) {
  for (const std::string& column : required) {
    const std::string* value = record.Find(column);
    if (value == nullptr) {
      std::vector<std::string> names;
      for (const auto& [name, text] : record.fields) names.push_back(name);
      const config_internal::NearestName nearest = config_internal::Nearest(column, names);
      return absl::StrCat("missing column '", column, "'",
                          nearest.typo ? absl::StrCat("; did you mean '", nearest.name, "'?") : "",
                          " (the record has: ", absl::StrJoin(names, ", "), ")");
    }
    if (layout.layout == ExampleLayout::kChat && !nlohmann::json::parse(*value, nullptr, false).is_array()) {
      return absl::StrCat("'", column, "' must be a JSON array of {role, content} or {from, value} turns");
    }
  }
  if (layout.layout == ExampleLayout::kPreference && record.Find(layout.input_columns[0]) == nullptr) {
    for (const std::string* column : {&layout.output_column, &layout.rejected_column}) {
      if (!nlohmann::json::parse(*record.Find(*column), nullptr, false).is_array()) {
        return absl::StrCat("missing column '", layout.input_columns[0], "': only conversations "
                            "(JSON arrays of turns) in '", *column, "' carry their prompt with them");
      }
    }
  }
  return "";
}

absl::Status SampleVerdict::Add(const std::string& where, const std::string& problem) {
  if (problem.empty()) {
    any_usable_ = true;
    return absl::OkStatus();
  }
  const std::string named = absl::StrCat(where, ": ", problem);
  if (!skip_malformed_) return absl::InvalidArgumentError(named);
  if (first_problem_.empty()) first_problem_ = named;
  return absl::OkStatus();
}

absl::Status SampleVerdict::Final() const {
  if (any_usable_ || first_problem_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "no sampled record has what the job reads (malformed_records: skip would skip them all): ",
      first_problem_));
}

}  // namespace qlora::data
