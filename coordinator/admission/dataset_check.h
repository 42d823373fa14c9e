// The submission-time check of a job's datasets: every file of the training and validation
// lists (each one file or a comma-separated list) must be a regular, non-empty file. A FIFO, a
// device or a folder given as a dataset would block or break whoever reads it (the shard planner,
// then every worker); an empty file has no record to train on. Each file is opened O_PATH
// beneath the read roots (confined_open.h) and only fstat(2) is used before it is known to be
// regular, so a check cannot block on a FIFO or a device nor be led out of the roots by a link. A Parquet file
// (data.format parquet, or auto and a .parquet name) then has its footer read (only the footer;
// an Arrow IPC file, its record batches counted through a mapping;
// opened with O_NONBLOCK): a truncated or corrupt file, or one without rows, is refused here.
// The check runs at Submit and Validate, outside the job manager's lock (stat on a slow mount
// may still take a while).
//
// A file can still be swapped after this check: the shard planner opens with O_NONBLOCK and
// checks the type again (common/dataset/byte_range_file.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/job_config.h"

namespace qlora::coordinator {

// OK, or INVALID_ARGUMENT naming the field (dataset / validation_dataset), the file and what is
// wrong ("is a FIFO (named pipe), not a regular file", "is empty"); NOT_FOUND when a file of a
// list does not exist. A bad Parquet file: INVALID_ARGUMENT naming the field and the file.
// `roots`: the read roots (as resolved and as written); empty: anywhere.
absl::Status CheckDatasetFiles(const DataConfig& data, const std::vector<std::string>& roots = {});

}  // namespace qlora::coordinator
