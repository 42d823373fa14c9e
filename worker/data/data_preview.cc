// The first records of a job's training data, built as a worker builds them (see data_preview.h).
#include "worker/data/data_preview.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/dataset/record_reader.h"
#include "common/dataset/shard_planner.h"
#include "common/status_macros.h"
#include "common/dataset/record_layout.h"
#include "worker/data/example_builder.h"
#include "worker/data/job_data_options.h"

namespace qlora::data {
namespace {

constexpr size_t kMaxRenderedBytes = 4000;

const char* LayoutName(ExampleLayout layout) {
  switch (layout) {
    case ExampleLayout::kInstruction: return "instruction";
    case ExampleLayout::kChat: return "chat";
    case ExampleLayout::kText: return "text";
    case ExampleLayout::kPreference: return "preference";
  }
  return "?";
}

std::string Where(const Record& record) {
  return record.line > 0 ? absl::StrCat(record.path, ":", record.line) : record.path;
}

// The example's text with the trained tokens between "[[" and "]]".
absl::StatusOr<std::string> Render(const Example& example, const Tokenizer& tokenizer) {
  std::string out;
  size_t i = 0;
  while (i < example.input_ids.size() && out.size() < kMaxRenderedBytes) {
    const bool trained = example.labels[i] != kIgnoreIndex;
    size_t j = i;
    while (j < example.input_ids.size() && (example.labels[j] != kIgnoreIndex) == trained) ++j;
    QLORA_ASSIGN_OR_RETURN(
        std::string text,
        tokenizer.Decode(std::vector<int32_t>(example.input_ids.begin() + i, example.input_ids.begin() + j)));
    absl::StrAppend(&out, trained ? "[[" : "", text, trained ? "]]" : "");
    i = j;
  }
  if (out.size() > kMaxRenderedBytes) out = absl::StrCat(out.substr(0, kMaxRenderedBytes), "...");
  return out;
}

}  // namespace

absl::StatusOr<DataPreview> PreviewJobData(const JobConfig& job, const Tokenizer& tokenizer,
                                           const DataPreviewOptions& options) {
  QLORA_ASSIGN_OR_RETURN(LoaderOptions loader, LoaderOptionsForJob(job, tokenizer, DatasetRole::kTrain, 0));
  QLORA_ASSIGN_OR_RETURN(ExampleBuilder builder, ExampleBuilder::Create(loader.example, &tokenizer));
  DataPreview preview;
  preview.layout = LayoutName(loader.example.layout);
  std::vector<std::string> optional;
  builder.Columns(&preview.columns, &optional);
  // Parquet reads only the job's columns (and names one the file lacks); the text formats read
  // every column, so that a missing one can be matched against those the records have.
  if (loader.reader.format == DataFormat::kParquet) {
    loader.reader.columns = preview.columns;
    loader.reader.optional_columns = optional;
  }
  const std::string first_file(absl::string_view(job.data.train_path).substr(0, job.data.train_path.find(',')));
  preview.file = first_file;
  ShardPlanOptions plan;
  plan.format = job.data.format;
  plan.max_record_bytes = loader.reader.max_record_bytes;
  QLORA_ASSIGN_OR_RETURN(std::vector<ShardSpec> shards, SplitFile(first_file, 1, plan));
  if (shards.empty()) return preview;  // no record: the submission check refuses an empty file
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> reader, RecordReader::Open(shards[0], loader.reader));
  SampleVerdict verdict(job.data.malformed_records == MalformedRecords::kSkip);
  Record record;
  Example example;
  while (preview.records < options.sample_records) {
    absl::StatusOr<bool> next = reader->Next(&record);
    if (!next.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset ", first_file, " read as ", job.data.format == DatasetFormat::kAuto ? "its extension says" : "data.format says",
          ": ", next.status().message()));
    }
    if (!*next) break;
    ++preview.records;
    // What the coordinator checks at submit first (in the same words), then what building finds.
    std::string problem = RecordLayoutProblem(record, loader.example, preview.columns);
    QLORA_RETURN_IF_ERROR(verdict.Add(Where(record), problem));
    example = Example();
    absl::StatusOr<bool> built = problem.empty() ? builder.Build(record, &example) : absl::StatusOr<bool>(false);
    if (!built.ok()) {
      problem = std::string(built.status().message());
      if (job.data.malformed_records == MalformedRecords::kFail) {
        return absl::InvalidArgumentError(absl::StrCat(Where(record), ": ", problem));
      }
    }
    if (!problem.empty()) {
      ++preview.malformed;
      if (preview.malformed_messages.size() < 5) {
        preview.malformed_messages.push_back(absl::StrCat(Where(record), ": ", problem));
      }
      continue;
    }
    if (!*built) continue;
    if (preview.example_line < 0) {
      preview.example_line = record.line;
      preview.example_tokens = static_cast<int64_t>(example.input_ids.size());
      preview.example_trained_tokens =
          std::count_if(example.labels.begin(), example.labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
      QLORA_ASSIGN_OR_RETURN(preview.rendered, Render(example, tokenizer));
      if (!example.rejected_input_ids.empty()) {  // a preference pair: its rejected side too
        Example rejected;
        rejected.input_ids = example.rejected_input_ids;
        rejected.labels = example.rejected_labels;
        QLORA_ASSIGN_OR_RETURN(const std::string rendered, Render(rejected, tokenizer));
        absl::StrAppend(&preview.rendered, "\n# rejected:\n", rendered);
      }
    }
  }
  QLORA_RETURN_IF_ERROR(verdict.Final());
  preview.malformed += reader->malformed_count();
  for (const std::string& m : reader->malformed_messages()) {
    if (preview.malformed_messages.size() < 5) preview.malformed_messages.push_back(m);
  }
  const ExampleStats& stats = builder.stats();
  preview.examples = stats.examples;
  preview.truncated = stats.truncated;
  preview.without_target = stats.dropped_no_target;
  return preview;
}

std::string DataPreviewText(const DataPreview& p) {
  std::string out = absl::StrCat(
      "# data: ", p.file, ", ", p.layout, " layout, columns ", absl::StrJoin(p.columns, ", "), "\n",
      "# sample: ", p.records, " record(s) read: ", p.examples, " example(s), ", p.truncated,
      " cut to max_sequence_length, ", p.without_target, " left without a target (dropped), ",
      p.malformed, " malformed (skipped)\n");
  for (const std::string& m : p.malformed_messages) absl::StrAppend(&out, "#   malformed: ", m, "\n");
  if (p.example_line >= 0 || !p.rendered.empty()) {
    absl::StrAppend(&out, "# example", p.example_line > 0 ? absl::StrCat(" (line ", p.example_line, ")") : "",
                    ": ", p.example_tokens, " tokens, ", p.example_trained_tokens,
                    " trained, shown between [[ and ]]:\n");
    absl::StrAppend(&out, "#   ", absl::StrReplaceAll(p.rendered, {{"\n", "\n#   "}}), "\n");
  }
  return out;
}

}  // namespace qlora::data
