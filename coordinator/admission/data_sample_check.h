// The submission-time check of a job's first training records (also `validate --remote`): what
// `qloractl validate` finds offline, less what needs the tokenizer. The first records of the
// first training file are read with the job's format and checked with the rules the workers
// build examples by (common/dataset/record_layout.h), so that a job that would fail once its
// workers start is refused at once, naming the file, the record's line and the column:
//   - content that is not the job's format (a CSV under `format: jsonl`) under
//     malformed_records: fail;
//   - a column the features or the prompt template's {placeholders} name that a record lacks,
//     with the nearest column the record has (under `skip`: when no sampled record has it);
//   - a chat column that is not a list of turns;
//   - a chat layout whose base model has no chat template, nor LLaMA-3's header tokens for the
//     built-in one (FAILED_PRECONDITION).
// Every file is opened beneath the read roots (confined_open.h); runs outside the manager's lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/job_config.h"

namespace qlora::coordinator {

absl::Status CheckDataSample(const JobConfig& config, const std::vector<std::string>& roots = {},
                             int64_t sample_records = 100);

}  // namespace qlora::coordinator
