// JSON array files: Alpaca's own layout, `[ {...}, {...} ]`, a file whose first byte after
// whitespace (and a UTF-8 BOM) is '['. Under format jsonl (or auto with a .json name) such a
// file is read as one record per top-level element, each an object as a JSON Lines record is.
// The shard planner cuts it at element starts (one sequential scan of the file); a reader scans
// its byte range element by element in constant memory (one element at a time, at most
// max_record_bytes kept). The scan tracks only strings, escapes and bracket depth: an element's
// syntax is the JSON parser's to check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/byte_range_file.h"
#include "common/dataset/record.h"

namespace qlora::data {

// The offset of the array's '[' when `file` is a JSON array, else -1. Reads from the start
// (leaves the file's position anywhere).
int64_t JsonArrayOpen(ByteRangeFile& file);

// Reads top-level elements of a JSON array from the file's position.
class JsonArrayScanner {
 public:
  explicit JsonArrayScanner(ByteRangeFile* file) : file_(file) {}

  struct Element {
    int64_t offset = 0;        // its first byte
    int64_t lines_before = 0;  // line ends read by this scanner before that byte
    bool too_long = false;     // longer than the max_bytes given: text holds its first bytes
  };
  // Skips whitespace and the commas between elements, then reads one element into *text (up
  // to `max_bytes` of it; 0: none kept). False at the array's ']' or the readable range's end.
  bool Next(Element* element, std::string* text, size_t max_bytes);
  int64_t lines() const { return lines_; }

 private:
  ByteRangeFile* file_;
  int64_t lines_ = 0;
  int pending_ = -1;  // a byte read past the previous element (its terminator)
};

// Cuts the JSON array `path` into at most `num_shards` shards of whole elements, near equal in
// bytes, each with its first line. An array without elements gives none.
absl::StatusOr<std::vector<ShardSpec>> SplitJsonArrayFile(const std::string& path,
                                                          ByteRangeFile& file, int64_t open,
                                                          int num_shards);

}  // namespace qlora::data
