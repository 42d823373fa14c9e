// Record-boundary search and shard assignment (see shard_planner.h for the CSV approach).
#include "common/dataset/shard_planner.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/dataset/csv_syntax.h"
#include "common/dataset/json_array.h"
#include "common/dataset/arrow_ipc_reader.h"
#include "common/dataset/parquet_reader.h"

namespace qlora::data {
namespace {

// First record end (position after '\n') at or after `from` for line formats.
int64_t NextLineStart(ByteRangeFile& file, int64_t from) {
  file.Seek(from, file.size());
  for (int c = file.Get(); c >= 0; c = file.Get())
    if (c == '\n') return file.position();
  return file.size();
}

// Exact CSV search: parse sequentially from a known record start.
absl::StatusOr<int64_t> SequentialCsvStart(ByteRangeFile& file, int64_t known_start,
                                           int64_t offset) {
  file.Seek(known_start, file.size());
  CsvState state = CsvState::kFieldStart;
  for (int c = file.Get(); c >= 0; c = file.Get()) {
    CsvStep step = StepCsv(state, static_cast<char>(c));
    state = step.next;
    if (step.record_end && file.position() >= offset) return file.position();
  }
  QLORA_RETURN_IF_ERROR(file.status());
  return file.size();
}

struct Hypothesis {
  CsvState state;
  bool alive = true;
  int64_t first_start = -1;  // position after its first record end
  int fields = 0;            // fields completed in the current record
  int64_t record_bytes = 0;  // content bytes of the current record ('\r' and '\n' excluded)
  int64_t quoted_run = 0;    // bytes since entering the current quoted field
};

absl::StatusOr<int64_t> SpeculativeCsvStart(ByteRangeFile& file, int64_t offset,
                                            int64_t known_start, int header_fields,
                                            const ShardPlanOptions& options) {
  const int64_t from = std::max(known_start, offset - 1);
  std::array<Hypothesis, kCsvStateCount> hyps;
  for (int s = 0; s < kCsvStateCount; ++s) hyps[s].state = static_cast<CsvState>(s);
  const int64_t scan_limit = 2 * options.max_record_bytes + (1 << 16);

  auto decided = [&]() -> int64_t {  // the agreed start, -1 while undecided, -2 when all died
    const Hypothesis* first = nullptr;
    for (const Hypothesis& h : hyps) {
      if (!h.alive) continue;
      if (h.first_start < 0) return -1;
      if (first && (h.state != first->state || h.first_start != first->first_start)) return -1;
      if (!first) first = &h;
    }
    return first ? first->first_start : -2;
  };

  file.Seek(from, file.size());
  int64_t result = -1;
  for (int c = file.Get(); c >= 0; c = file.Get()) {
    const int64_t after = file.position();
    for (Hypothesis& h : hyps) {
      if (!h.alive) continue;
      CsvStep step = StepCsv(h.state, static_cast<char>(c));
      if (step.violation) h.alive = false;
      h.quoted_run = step.next == CsvState::kQuoted ? h.quoted_run + 1 : 0;
      if (h.quoted_run > options.max_record_bytes) h.alive = false;
      if (c != '\r' && c != '\n') ++h.record_bytes;
      if (step.field_end) ++h.fields;
      if (step.record_end) {
        if (h.first_start < 0) {
          h.first_start = after;
        } else if (h.record_bytes > 0 && h.fields != header_fields) {
          h.alive = false;
        }
        h.fields = 0;
        h.record_bytes = 0;
      }
      h.state = step.next;
    }
    result = decided();
    if (result != -1 || after - from > scan_limit) break;
  }
  QLORA_RETURN_IF_ERROR(file.status());
  if (options.stats) options.stats->bytes_scanned += file.position() - from;
  if (file.position() >= file.size() && result == -1) {
    // End of file: a hypothesis inside quotes is dead; one without a record end cuts at EOF.
    for (Hypothesis& h : hyps) {
      if (h.state == CsvState::kQuoted) h.alive = false;
      if (h.first_start < 0) h.first_start = file.size();
    }
    result = decided();
  }
  if (result >= 0) {
    if (options.stats) ++options.stats->speculative_cuts;
    return result;
  }
  if (options.stats) ++options.stats->sequential_cuts;
  QLORA_ASSIGN_OR_RETURN(int64_t start, SequentialCsvStart(file, known_start, offset));
  if (options.stats) options.stats->bytes_scanned += file.position() - known_start;
  return start;
}

// Parquet: rows [begin, end) from the footer alone. With at least as many row groups as shards,
// cuts fall on row-group boundaries (the first at or after each equal row share), so a rank
// decodes only its own row groups; with fewer, cuts fall at the equal row shares themselves
// and the ranks sharing a row group each decode it and keep their rows.
absl::StatusOr<std::vector<ShardSpec>> SplitParquetFile(const std::string& path, int num_shards) {
  QLORA_ASSIGN_OR_RETURN(ParquetLayout layout, ReadParquetLayout(path));
  std::vector<int64_t> boundaries;  // row-group starts after the first, then the row count
  for (int64_t start = 0, g = 0; g < static_cast<int64_t>(layout.row_group_rows.size()); ++g) {
    start += layout.row_group_rows[g];
    boundaries.push_back(start);
  }
  const bool by_row_group = static_cast<int64_t>(layout.row_group_rows.size()) >= num_shards;
  std::vector<ShardSpec> shards;
  int64_t begin = 0;
  for (int i = 1; i <= num_shards && begin < layout.rows; ++i) {
    int64_t end = static_cast<int64_t>(static_cast<long double>(layout.rows) * i / num_shards);
    if (i == num_shards) end = layout.rows;
    if (by_row_group) end = *std::lower_bound(boundaries.begin(), boundaries.end(), end);
    if (end <= begin) continue;
    shards.push_back({path, begin, end, begin + 1});
    begin = end;
  }
  return shards;
}

// Arrow IPC: rows [begin, end) at equal row shares; a rank skips the record batches before its
// rows without reading them (the file is mapped).
absl::StatusOr<std::vector<ShardSpec>> SplitArrowFile(const std::string& path, int num_shards) {
  QLORA_ASSIGN_OR_RETURN(ArrowLayout layout, ReadArrowLayout(path));
  std::vector<ShardSpec> shards;
  int64_t begin = 0;
  for (int i = 1; i <= num_shards && begin < layout.rows; ++i) {
    const int64_t end = i == num_shards ? layout.rows
                                        : static_cast<int64_t>(static_cast<long double>(layout.rows) * i / num_shards);
    if (end <= begin) continue;
    shards.push_back({path, begin, end, begin + 1});
    begin = end;
  }
  return shards;
}

}  // namespace

absl::StatusOr<int64_t> FindRecordStart(ByteRangeFile& file, DataFormat format, int64_t offset,
                                        int64_t known_start, int header_fields,
                                        const ShardPlanOptions& options) {
  if (offset <= known_start) return known_start;
  if (offset >= file.size()) return file.size();
  if (format != DataFormat::kCsv) {
    int64_t start = NextLineStart(file, offset - 1);
    QLORA_RETURN_IF_ERROR(file.status());
    if (options.stats) options.stats->bytes_scanned += start - (offset - 1);
    return start;
  }
  return SpeculativeCsvStart(file, offset, known_start, header_fields, options);
}

absl::StatusOr<DataStart> FindDataStart(ByteRangeFile& file, DataFormat format) {
  DataStart start;
  if (format != DataFormat::kCsv) return start;
  file.Seek(0, file.size());
  CsvState state = CsvState::kFieldStart;
  bool ended = false;
  for (int c = file.Get(); c >= 0 && !ended; c = ended ? -1 : file.Get()) {
    CsvStep step = StepCsv(state, static_cast<char>(c));
    state = step.next;
    if (step.field_end) ++start.header_fields;
    if (c == '\n') ++start.header_lines;
    ended = step.record_end;
  }
  QLORA_RETURN_IF_ERROR(file.status());
  if (!ended) {
    if (state == CsvState::kQuoted)
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": unterminated CSV header"));
    if (file.size() > 0) ++start.header_fields;  // a header without a line end
  }
  start.offset = file.position();
  return start;
}

absl::StatusOr<std::vector<ShardSpec>> SplitFile(const std::string& path, int num_shards,
                                                 const ShardPlanOptions& options) {
  if (num_shards < 1) return absl::InvalidArgumentError("num_shards must be >= 1");
  QLORA_ASSIGN_OR_RETURN(DataFormat format, ResolveFormat(options.format, path));
  if (format == DataFormat::kParquet) return SplitParquetFile(path, num_shards);
  if (format == DataFormat::kArrow) return SplitArrowFile(path, num_shards);
  QLORA_ASSIGN_OR_RETURN(auto file, ByteRangeFile::Open(path));
  if (format == DataFormat::kJsonl) {
    if (const int64_t open = JsonArrayOpen(*file); open >= 0) {
      return SplitJsonArrayFile(path, *file, open, num_shards);
    }
  }
  QLORA_ASSIGN_OR_RETURN(DataStart data, FindDataStart(*file, format));
  const int64_t size = file->size();
  std::vector<ShardSpec> shards;
  int64_t begin = data.offset;
  for (int i = 1; i <= num_shards && begin < size; ++i) {
    int64_t end = size;
    if (i < num_shards) {
      const int64_t approx = data.offset + static_cast<int64_t>(
          static_cast<long double>(size - data.offset) * i / num_shards);
      QLORA_ASSIGN_OR_RETURN(end, FindRecordStart(*file, format, approx, begin,
                                                  data.header_fields, options));
    }
    if (end <= begin) continue;
    shards.push_back({path, begin, end, shards.empty() ? data.header_lines + 1 : -1});
    begin = end;
  }
  return shards;
}

absl::StatusOr<std::vector<std::vector<ShardSpec>>> PlanShards(
    const std::vector<std::string>& paths, int world_size, const ShardPlanOptions& options) {
  if (world_size < 1) return absl::InvalidArgumentError("world_size must be >= 1");
  if (options.chunk_bytes < 1 || options.max_chunks_per_file < 1)
    return absl::InvalidArgumentError("chunk_bytes and max_chunks_per_file must be >= 1");
  std::vector<ShardSpec> chunks;
  for (const std::string& path : paths) {
    QLORA_ASSIGN_OR_RETURN(auto file, ByteRangeFile::Open(path));
    const int64_t wanted = (file->size() + options.chunk_bytes - 1) / options.chunk_bytes;
    const int n = static_cast<int>(
        std::clamp<int64_t>(wanted, 1, options.max_chunks_per_file));
    QLORA_ASSIGN_OR_RETURN(std::vector<ShardSpec> split, SplitFile(path, n, options));
    for (ShardSpec& chunk : split) chunks.push_back(std::move(chunk));
  }
  std::vector<std::vector<ShardSpec>> plan(world_size, chunks);
  for (int rank = 0; rank < world_size; ++rank) {
    for (ShardSpec& chunk : plan[rank]) {
      chunk.stride = world_size;
      chunk.phase = rank;
    }
  }
  return plan;
}

}  // namespace qlora::data
