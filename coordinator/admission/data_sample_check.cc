// The first training records checked as the workers will read them (see data_sample_check.h).
#include "coordinator/admission/data_sample_check.h"

#include <sys/stat.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/dataset/record_layout.h"
#include "common/dataset/record_reader.h"
#include "common/dataset/shard_planner.h"
#include "common/posix_files.h"
#include "common/status_macros.h"
#include "coordinator/admission/confined_open.h"
#include "nlohmann/json.hpp"

namespace qlora::coordinator {
namespace {

constexpr int64_t kMaxTokenizerBytes = 64 << 20;

// The text of `name` in the model folder (beneath the roots), "" when it is absent or too large.
std::string ModelFile(const std::string& model_dir, const char* name, const std::vector<std::string>& roots) {
  absl::StatusOr<ConfinedFile> file = ConfinedFile::Open(JoinPath(model_dir, name), roots);
  struct stat st;
  if (!file.ok() || fstat(file->fd(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxTokenizerBytes) return "";
  absl::StatusOr<std::string> text = ReadFile(file->path_for_readers());
  return text.ok() ? *text : "";
}

// A chat layout needs the tokenizer's chat template, or LLaMA-3's header tokens for the
// built-in layout (what data::ExampleBuilder::Create refuses otherwise). A SentencePiece model
// (no tokenizer.json) is left to the workers.
absl::Status CheckChatTokenizer(const JobConfig& config, const data::ExampleOptions& layout,
                                const std::vector<std::string>& roots) {
  if (layout.layout != data::ExampleLayout::kChat || config.base_model_path.empty()) return absl::OkStatus();
  if (layout.use_tokenizer_chat_template) {
    const nlohmann::json tokenizer_config = nlohmann::json::parse(
        ModelFile(config.base_model_path, "tokenizer_config.json", roots), nullptr, false);
    if (tokenizer_config.is_object() && tokenizer_config.contains("chat_template") &&
        !tokenizer_config["chat_template"].empty()) {
      return absl::OkStatus();
    }
  }
  const std::string tokenizer = ModelFile(config.base_model_path, "tokenizer.json", roots);
  if (tokenizer.empty()) return absl::OkStatus();
  for (const char* token : {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
    if (tokenizer.find(token) == std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data: the chat column '", layout.input_columns[0], "' needs a chat template, and base_model '",
          config.base_model_path, "' has none (no chat_template in tokenizer_config.json",
          layout.use_tokenizer_chat_template ? "" : ", which data.prompt_template: llama3_chat ignores",
          ") nor LLaMA-3's ", token, " for the built-in layout; use a model whose tokenizer has a "
          "chat template, or name instruction and output columns"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDataSample(const JobConfig& config, const std::vector<std::string>& roots,
                             int64_t sample_records) {
  if (config.data.train_path.empty()) return absl::OkStatus();
  const std::string path = config.data.train_path.substr(0, config.data.train_path.find(','));
  QLORA_ASSIGN_OR_RETURN(const data::DataFormat format, data::ResolveFormat(config.data.format, path));
  std::vector<std::string> inputs, outputs;
  for (const FeatureConfig& feature : config.input_features) inputs.push_back(feature.name);
  for (const FeatureConfig& feature : config.output_features) outputs.push_back(feature.name);
  QLORA_ASSIGN_OR_RETURN(const data::ExampleOptions layout,
                         IsPreferenceJob(config) ? data::PreferenceLayout(format, inputs, outputs, config.data.max_sequence_length)
                                    : data::LayoutForJob(format, inputs, outputs, config.data.prompt_template,
                                                         config.data.max_sequence_length));
  std::vector<std::string> required, optional;
  QLORA_RETURN_IF_ERROR(data::ColumnsOfLayout(layout, &required, &optional));
  QLORA_RETURN_IF_ERROR(CheckChatTokenizer(config, layout, roots));

  // The file itself beneath the roots; its readers see /proc/self/fd/N, named back as `path`.
  QLORA_ASSIGN_OR_RETURN(ConfinedFile file, ConfinedFile::Open(path, roots));
  const std::string readable = file.path_for_readers();
  auto named = [&](absl::string_view message) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset: ", absl::StrReplaceAll(message, {{readable, path}})));
  };
  data::ShardPlanOptions plan;
  plan.format = static_cast<DatasetFormat>(static_cast<int>(format) + 1);  // kJsonl... after kAuto
  plan.max_record_bytes = data::MaxRecordBytesForRows(config.data.max_sequence_length);
  absl::StatusOr<std::vector<data::ShardSpec>> shards = data::SplitFile(readable, 1, plan);
  if (!shards.ok()) return named(shards.status().message());
  if (shards->empty()) return absl::OkStatus();  // no record: CheckDatasetFiles names an empty file
  data::ReaderOptions options;
  options.format = format;
  options.skip_malformed = config.data.malformed_records == MalformedRecords::kSkip;
  options.max_record_bytes = plan.max_record_bytes;
  if (format == data::DataFormat::kParquet || format == data::DataFormat::kArrow) {
    options.columns = required;  // a column the file lacks is named by the reader
    options.optional_columns = optional;
  }
  absl::StatusOr<std::unique_ptr<data::RecordReader>> reader = data::RecordReader::Open((*shards)[0], options);
  if (!reader.ok()) return named(reader.status().message());
  data::SampleVerdict verdict(options.skip_malformed);
  data::Record record;
  for (int64_t n = 0; n < sample_records; ++n) {
    absl::StatusOr<bool> next = (*reader)->Next(&record);
    if (!next.ok()) return named(next.status().message());
    if (!*next) break;
    const std::string where = record.line > 0 ? absl::StrCat(path, ":", record.line) : path;
    if (absl::Status s = verdict.Add(where, data::RecordLayoutProblem(record, layout, required)); !s.ok()) {
      return named(s.message());
    }
  }
  if (absl::Status s = verdict.Final(); !s.ok()) return named(s.message());
  return absl::OkStatus();
}

}  // namespace qlora::coordinator
