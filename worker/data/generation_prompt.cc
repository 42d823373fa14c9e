// GenerationPrompts: the prompt as a training record whose target is a placeholder, built by the
// job's ExampleBuilder; the prompt is every token before the first trained one.
#include "worker/data/generation_prompt.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/dataset/record_reader.h"
#include "common/dataset/shard_planner.h"
#include "common/status_macros.h"
#include "worker/data/job_data_options.h"

namespace qlora::data {
namespace {

// The target's stand-in: its tokens are the first trained ones, so everything before them is
// the prompt. A letter, so that it starts a token of its own after the layout's separators.
constexpr char kTargetPlaceholder[] = "x";

// Every token of `example` before its first trained one.
std::vector<int32_t> BeforeTheTarget(const Example& example) {
  const auto first_trained = std::find_if(example.labels.begin(), example.labels.end(),
                                          [](int32_t label) { return label != kIgnoreIndex; });
  return std::vector<int32_t>(example.input_ids.begin(),
                              example.input_ids.begin() + (first_trained - example.labels.begin()));
}

}  // namespace

absl::StatusOr<GenerationPrompts> GenerationPrompts::ForJob(const JobConfig& job,
                                                            const Tokenizer* tokenizer,
                                                            int max_prompt_tokens) {
  QLORA_ASSIGN_OR_RETURN(LoaderOptions loader, LoaderOptionsForJob(job, *tokenizer, DatasetRole::kTrain, 0));
  ExampleOptions options = loader.example;
  // A prompt is never cut: the caller bounds it by the model's context instead.
  options.max_sequence_length = max_prompt_tokens + 64;
  QLORA_ASSIGN_OR_RETURN(ExampleBuilder builder, ExampleBuilder::Create(options, tokenizer));
  return GenerationPrompts(std::move(options), std::make_shared<ExampleBuilder>(std::move(builder)));
}

absl::StatusOr<Record> GenerationPrompts::PromptRecord(const std::string& prompt) const {
  Record record;
  record.path = "prompt";
  nlohmann::json object = nlohmann::json::parse(prompt, nullptr, /*allow_exceptions=*/false);
  const bool is_object = object.is_object();
  if (options_.layout == ExampleLayout::kChat) {
    const std::string& column = options_.input_columns.at(0);
    nlohmann::json turns = nlohmann::json::array();
    if (is_object) {
      for (const char* key : {"messages", "conversations"}) {
        if (object.contains(key)) turns = object[key];
      }
      if (!turns.is_array() || turns.empty()) {
        return absl::InvalidArgumentError(
            "a JSON prompt under a chat layout needs `messages`: a list of {role, content} turns");
      }
    } else {
      turns.push_back({{"role", "user"}, {"content", prompt}});
    }
    turns.push_back({{"role", "assistant"}, {"content", kTargetPlaceholder}});
    record.fields.emplace_back(column, turns.dump());
    return record;
  }
  if (is_object) {
    for (const auto& [key, value] : object.items()) {
      record.fields.emplace_back(key, value.is_string() ? value.get<std::string>() : value.dump());
    }
  } else {
    if (options_.input_columns.size() != 1 && options_.layout == ExampleLayout::kInstruction) {
      std::string columns;
      for (const std::string& c : options_.input_columns) absl::StrAppend(&columns, columns.empty() ? "" : ", ", c);
      return absl::InvalidArgumentError(absl::StrCat(
          "the job's template reads ", options_.input_columns.size(), " columns (", columns,
          "): give the prompt as a JSON object with them"));
    }
    record.fields.emplace_back(options_.input_columns.at(0), prompt);
  }
  if (!options_.output_column.empty() && record.Find(options_.output_column) == nullptr) {
    record.fields.emplace_back(options_.output_column, kTargetPlaceholder);
  }
  return record;
}

absl::StatusOr<std::vector<int32_t>> GenerationPrompts::Ids(const std::string& prompt) {
  if (options_.layout == ExampleLayout::kPreference) return PreferenceIds(prompt);
  QLORA_ASSIGN_OR_RETURN(Record record, PromptRecord(prompt));
  Example example;
  absl::StatusOr<bool> built = builder_->Build(record, &example);
  if (!built.ok()) return absl::InvalidArgumentError(absl::StrCat("prompt: ", built.status().message()));
  if (static_cast<int>(example.input_ids.size()) >= options_.max_sequence_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt takes more than the model's context of ", options_.max_sequence_length - 64,
        " tokens"));
  }
  if (options_.layout == ExampleLayout::kText) {
    // Every token is trained: the prompt is the whole text, less the end of sequence.
    example.input_ids.pop_back();
    return example.input_ids;
  }
  return BeforeTheTarget(example);
}

absl::StatusOr<std::vector<int32_t>> GenerationPrompts::PreferenceIds(const std::string& prompt) const {
  // Text, or a JSON object whose `prompt` (TRL's column) or `messages` is the conversation so far.
  std::string text = prompt;
  const nlohmann::json object = nlohmann::json::parse(prompt, nullptr, /*allow_exceptions=*/false);
  if (object.is_object()) {
    const char* key = object.contains("prompt") ? "prompt" : object.contains("messages") ? "messages" : nullptr;
    if (key == nullptr) {
      return absl::InvalidArgumentError("a JSON prompt of a preference job needs `prompt` (text or turns) or `messages`");
    }
    text = object[key].is_string() ? object[key].get<std::string>() : object[key].dump();
  }
  absl::StatusOr<std::vector<int32_t>> ids = builder_->PreferencePrompt(text);
  if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message()));
  if (static_cast<int>(ids->size()) >= options_.max_sequence_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt takes more than the model's context of ", options_.max_sequence_length - 64, " tokens"));
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> GenerationPrompts::IdsOfRecord(const Record& record) {
  Example example;
  absl::StatusOr<bool> built = builder_->Build(record, &example);
  if (!built.ok()) return absl::InvalidArgumentError(absl::StrCat("record: ", built.status().message()));
  if (options_.layout == ExampleLayout::kText) {
    const size_t keep = std::min<size_t>(32, std::max<size_t>(1, example.input_ids.size() / 2));
    return std::vector<int32_t>(example.input_ids.begin(), example.input_ids.begin() + keep);
  }
  return BeforeTheTarget(example);
}

absl::StatusOr<std::vector<Record>> GenerationPrompts::FirstRecords(const JobConfig& job,
                                                                    const Tokenizer& tokenizer,
                                                                    int64_t count) {
  const DatasetRole role = job.data.validation_path.empty() ? DatasetRole::kTrain : DatasetRole::kValidation;
  QLORA_ASSIGN_OR_RETURN(LoaderOptions loader, LoaderOptionsForJob(job, tokenizer, role, 0));
  const std::string& paths = DatasetPathForRole(job, role);
  const std::string first_file = paths.substr(0, paths.find(','));
  ShardPlanOptions plan;
  plan.format = job.data.format;
  plan.max_record_bytes = loader.reader.max_record_bytes;
  QLORA_ASSIGN_OR_RETURN(std::vector<ShardSpec> shards, SplitFile(first_file, 1, plan));
  std::vector<Record> records;
  if (shards.empty()) return records;
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> reader, RecordReader::Open(shards[0], loader.reader));
  Record record;
  while (static_cast<int64_t>(records.size()) < count) {
    QLORA_ASSIGN_OR_RETURN(bool more, reader->Next(&record));
    if (!more) break;
    records.push_back(record);
  }
  return records;
}

}  // namespace qlora::data
