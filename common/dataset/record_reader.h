// Streaming record readers over one shard (a byte range of one file), in constant memory: JSON
// Lines, CSV (RFC 4180) and plain text; Parquet (row ranges) in parquet_reader.h. One buffer and
// one record are held at a time.
//
//  - JSON Lines: one JSON object per line; blank lines are not records.
//  - CSV: the first record of the file is the header (read from offset 0 by every shard);
//    quoted fields may hold ',', '""' and line ends; LF or CRLF line ends; blank lines are not
//    records; every record must have the header's field count.
//  - Text: one record per line, column "text" (the line without its line end); blank lines
//    are not records. (Language-model data with one document per line.)
//
// A malformed record (bad JSON, not an object, wrong field count, stray quote, unterminated
// quote, longer than max_record_bytes) is an error naming file, line and reason under the
// "fail" policy; under "skip" it is counted (malformed_count) and its message kept (the first
// few), never dropped silently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/byte_range_file.h"
#include "common/dataset/record.h"

namespace qlora::data {

struct ReaderOptions {
  DataFormat format = DataFormat::kJsonl;
  bool skip_malformed = false;           // DataConfig::malformed_records == "skip"
  int64_t max_record_bytes = 1 << 20;    // longer records are malformed (bounds memory)
  size_t kept_messages = 16;             // how many malformed-record messages to keep
  // The columns the job reads (ExampleBuilder::Columns), both empty = all. Parquet reads only
  // these and refuses a file that lacks a required one; the text formats read every column.
  std::vector<std::string> columns;           // required
  std::vector<std::string> optional_columns;  // read when the file has them
};

class RecordReader {
 public:
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(const ShardSpec& shard,
                                                            const ReaderOptions& options);
  virtual ~RecordReader() = default;

  // Reads the next record into *record; false at the end of the shard.
  absl::StatusOr<bool> Next(Record* record);

  int64_t malformed_count() const { return malformed_count_; }
  const std::vector<std::string>& malformed_messages() const { return malformed_messages_; }
  const ShardSpec& shard() const { return shard_; }

 protected:
  RecordReader(const ShardSpec& shard, const ReaderOptions& options,
               std::unique_ptr<ByteRangeFile> file);

  // One raw record: fills *record (fields and offset), sets *lines_before to the number of
  // line ends between the shard's begin and the record's first byte, and *reason when the
  // record is malformed. False at the end.
  virtual absl::StatusOr<bool> ParseNext(Record* record, int64_t* lines_before,
                                         std::string* reason) = 0;

  ShardSpec shard_;
  ReaderOptions options_;
  std::unique_ptr<ByteRangeFile> file_;  // null for Parquet (parquet_reader.cc reads the file)

 private:
  absl::StatusOr<int64_t> FileLine(int64_t lines_before);

  int64_t malformed_count_ = 0;
  std::vector<std::string> malformed_messages_;
  int64_t lines_before_shard_ = -1;  // line ends in [0, begin), counted on first error
};

// The CSV reader (csv_reader.cc).
absl::StatusOr<std::unique_ptr<RecordReader>> OpenCsvReader(const ShardSpec& shard,
                                                            const ReaderOptions& options,
                                                            std::unique_ptr<ByteRangeFile> file);

}  // namespace qlora::data
