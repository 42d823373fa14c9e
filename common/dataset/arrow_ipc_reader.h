// Arrow IPC datasets, Arrow-free interface: what Hugging Face `datasets` writes with
// save_to_disk and in its cache (the IPC streaming format, `data-00000-of-00001.arrow`), and
// Arrow's file format (starting with "ARROW1"). Only arrow_ipc_reader.cc includes Arrow.
//
// As for Parquet (parquet_reader.h), a shard counts rows: ShardSpec rows [begin, end), first_line
// = begin + 1, a record's "line" its 1-based row; values read as text the same way
// (arrow_values.h); a required column the file lacks is an error naming the file. The file is
// memory-mapped (opened O_NONBLOCK and checked to be a regular file first), so that counting
// the rows or skipping to a shard reads record-batch headers, not the data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/record_reader.h"

namespace qlora::data {

struct ArrowLayout {
  std::vector<int64_t> batch_rows;  // rows per record batch, in file order
  int64_t rows = 0;                 // their sum
};
// The record batches of an Arrow IPC file; INVALID_ARGUMENT naming the file when it is not one.
absl::StatusOr<ArrowLayout> ReadArrowLayout(const std::string& path);

// The reader of one Arrow IPC shard (rows [shard.begin, shard.end)).
absl::StatusOr<std::unique_ptr<RecordReader>> OpenArrowReader(const ShardSpec& shard,
                                                              const ReaderOptions& options);

}  // namespace qlora::data
