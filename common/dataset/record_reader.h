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
//
// Selection and interleaving happen before parsing: every reader finds record boundaries
// (ReadRaw: a line end, or for CSV the quote-aware scan) and parses only the records it keeps
// (Parse: the JSON parse, the CSV field check). A record is kept when it passes
// ReaderOptions::select (e.g. the train/validation split) and its index among the selected
// records, counted from ReaderOptions::first_index, is phase modulo the shard's stride. A
// malformed record is reported only by the reader that keeps it. A reader of another format
// (e.g. row groups) follows the same rule by implementing ReadRaw and Parse.
#pragma once

#include <cstdint>
#include <functional>
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
  // Optional: whether the record starting at this byte offset of the shard's file is wanted at
  // all (records it rejects are neither counted for interleaving nor parsed).
  std::function<bool(int64_t offset)> select;
  // The interleaving index of the shard's first selected record: the selected records of the
  // shards read before it in the same sequence (next_index() of the previous reader).
  int64_t first_index = 0;
};

// The record bound for rows of `max_sequence_length` tokens: 1 MiB, or 16 bytes a token where
// that is more, so that one record can fill the longest row a job asks for (English text is
// about 4 bytes a token; escapes, markup and text past the cut take more) while a record's
// memory stays bounded (16 MiB at the schema's longest rows, 1,048,576 tokens).
int64_t MaxRecordBytesForRows(int64_t max_sequence_length);

class RecordReader {
 public:
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(const ShardSpec& shard,
                                                            const ReaderOptions& options);
  virtual ~RecordReader() = default;

  // Reads the next record into *record; false at the end of the shard.
  absl::StatusOr<bool> Next(Record* record);

  // The interleaving index after the records seen so far (pass it on as the next shard's
  // first_index).
  int64_t next_index() const { return next_index_; }
  int64_t malformed_count() const { return malformed_count_; }
  const std::vector<std::string>& malformed_messages() const { return malformed_messages_; }
  const ShardSpec& shard() const { return shard_; }

 protected:
  RecordReader(const ShardSpec& shard, const ReaderOptions& options,
               std::unique_ptr<ByteRangeFile> file);

  // Advances past the next record (blank lines are not records) and keeps what Parse needs:
  // sets *offset to its first byte and *lines_before to the number of line ends between the
  // shard's begin and that byte. False at the end. Does no more than finding the record's end
  // requires.
  virtual absl::StatusOr<bool> ReadRaw(int64_t* offset, int64_t* lines_before) = 0;
  // Parses the record ReadRaw read last into record->fields (empty on entry), or sets *reason
  // when it is malformed.
  virtual void Parse(Record* record, std::string* reason) = 0;

  ShardSpec shard_;
  ReaderOptions options_;
  std::unique_ptr<ByteRangeFile> file_;  // null for Parquet (parquet_reader.cc reads the file)

 private:
  absl::StatusOr<int64_t> FileLine(int64_t lines_before);

  int64_t next_index_ = 0;
  int64_t malformed_count_ = 0;
  std::vector<std::string> malformed_messages_;
  int64_t lines_before_shard_ = -1;  // line ends in [0, begin), counted on first error
};

// The CSV reader (csv_reader.cc).
absl::StatusOr<std::unique_ptr<RecordReader>> OpenCsvReader(const ShardSpec& shard,
                                                            const ReaderOptions& options,
                                                            std::unique_ptr<ByteRangeFile> file);

}  // namespace qlora::data
