// The unit the data path streams: a byte range of one dataset file (ShardSpec), the format of
// such a file (DataFormat), and one parsed row of it (Record).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/config_enums.h"

namespace qlora::data {

// Bytes [begin, end) of `path`. `begin` is always the first byte of a record (or the start of
// the file); `end` is the next shard's `begin` (or the file size), so the shards of one file
// cover it exactly. first_line is the 1-based file line at `begin`, or -1 when unknown (the
// planner does not read whole files; readers then count lines only to report an error).
// Parquet counts rows instead of bytes and lines: rows [begin, end) (parquet_reader.h).
//
// Interleaving: a reader keeps only the records whose index in the reading sequence satisfies
// index % stride == phase (the sequence runs on across the shards a loader reads in one epoch;
// see ReaderOptions::first_index). Ranks that read the same ranges with stride = world size
// and phase = rank split the records between them, counts differing by at most one. stride 1
// keeps every record.
struct ShardSpec {
  std::string path;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t first_line = -1;  // Parquet: begin + 1 (a Parquet record's "line" is its 1-based row)
  int stride = 1;
  int phase = 0;
};

enum class DataFormat { kJsonl, kCsv, kText, kParquet, kArrow };

// "jsonl" | "csv" | "text" | "parquet", or "auto" (by extension: .jsonl/.ndjson/.json, .csv,
// .txt/.text, .parquet).
// The format of `path`: `format` itself, or for kAuto the one its extension names.
absl::StatusOr<DataFormat> ResolveFormat(DatasetFormat format, absl::string_view path);
// The same for a format's name ("auto", "jsonl", "csv", "text", "parquet"), e.g. a flag.
absl::StatusOr<DataFormat> ResolveFormat(absl::string_view format, absl::string_view path);
absl::string_view FormatName(DataFormat format);

// One row. Column order is the file's (CSV header order, JSON key order, Parquet schema order).
// A JSON value that is not a string (number, bool, array, object) is kept as its compact JSON
// text; null becomes "". Parquet values follow the same rule (parquet_reader.h).
struct Record {
  std::vector<std::pair<std::string, std::string>> fields;
  std::string path;
  int64_t offset = 0;  // byte offset of the record's first byte in the file (Parquet: row index)
  int64_t line = -1;   // 1-based file line of that byte, -1 when the shard's first_line is unknown
                       // (Parquet: the 1-based row)

  // The value of column `name`, or nullptr.
  const std::string* Find(absl::string_view name) const {
    for (const auto& [key, value] : fields)
      if (key == name) return &value;
    return nullptr;
  }
};

}  // namespace qlora::data
