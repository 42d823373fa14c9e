// Parquet datasets, Arrow-free interface: the footer facts the shard planner needs, and the
// streaming record reader. Only parquet_reader.cc includes Arrow (whose headers need C++20).
//
// A Parquet shard counts rows, not bytes: ShardSpec rows [begin, end) of the file, first_line =
// begin + 1 (a record's "line" in messages is its 1-based row; Record::offset is its 0-based
// row). The reader decodes only the row groups that overlap the shard, in batches, and only
// the columns that ReaderOptions::columns and optional_columns name (all when both are empty);
// a required column that the file lacks is an error naming the file, whatever the
// malformed-record policy.
//
// Values as text, as the JSON Lines reader keeps them: strings (and binary) as they are; null
// as ""; integers, floats and bools as their JSON text ("7", "0.5", "true"); lists, structs and
// maps as compact JSON (a list<struct<role, content>> `messages` column reads as the JSONL
// `messages` array; a map is a list of {"key", "value"} objects; a dictionary column as its
// values); any other type (dates, timestamps, decimals) as Arrow's text of the value. A record
// whose values add up to more than max_record_bytes is malformed (the policy applies).
// A file that is not Parquet, truncated or corrupt is an error naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/record_reader.h"

namespace qlora::data {

// What the footer says about the row groups; reads the footer only.
struct ParquetLayout {
  std::vector<int64_t> row_group_rows;  // rows per row group, in file order
  int64_t rows = 0;                     // their sum
};
absl::StatusOr<ParquetLayout> ReadParquetLayout(const std::string& path);

// The reader of one Parquet shard (rows [shard.begin, shard.end)).
absl::StatusOr<std::unique_ptr<RecordReader>> OpenParquetReader(const ShardSpec& shard,
                                                                const ReaderOptions& options);

}  // namespace qlora::data
