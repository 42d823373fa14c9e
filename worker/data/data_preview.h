// A look at a job's data before it runs (`qloractl validate`): the first records of the
// training file read with the job's reader, layout, template and tokenizer, exactly as a worker
// would build them. Says what would fail (a column the template or the features name that the
// records lack, the content not being the format the job says) naming the file, the record's
// line and the column, with the nearest column the records have; counts what a run would drop
// or cut on that sample (malformed records under `skip`, records left without a target, records
// cut to max_sequence_length); and renders one example with its label mask.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

struct DataPreviewOptions {
  int64_t sample_records = 200;  // read from the start of the first training file
};

struct DataPreview {
  std::string file;                       // the file sampled
  std::string layout;                     // "instruction", "chat" or "text"
  std::vector<std::string> columns;       // the columns the job reads
  int64_t records = 0;                    // records read, malformed included
  int64_t malformed = 0;                  // skipped (malformed_records: skip)
  int64_t examples = 0;                   // built
  int64_t truncated = 0;                  // cut to max_sequence_length
  int64_t without_target = 0;             // dropped: nothing left to train on
  std::vector<std::string> malformed_messages;  // the first few
  // The first example built: its line, token counts, and its text with the trained spans
  // between "[[" and "]]" (every other token is context only).
  int64_t example_line = -1;
  int64_t example_tokens = 0;
  int64_t example_trained_tokens = 0;
  std::string rendered;
};

// INVALID_ARGUMENT naming the file, line and column (and the nearest column the record has) when
// a sampled record would fail the job: a missing column, a chat column that is not a list of
// turns, content that is not the job's format (under malformed_records: fail); or when every
// sampled record lacks a column (under skip too: a misspelled column trains nothing).
absl::StatusOr<DataPreview> PreviewJobData(const JobConfig& job, const Tokenizer& tokenizer,
                                           const DataPreviewOptions& options = {});

// The preview as the lines `qloractl validate` prints.
std::string DataPreviewText(const DataPreview& preview);

}  // namespace qlora::data
