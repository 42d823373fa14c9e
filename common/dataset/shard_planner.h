// Splits dataset files into chunks at record boundaries by byte ranges and plans which records
// each rank reads. Reads only a few bytes around each cut, never whole files.
//
// Record-interleaved plan: every rank gets every chunk, with stride = world size and phase =
// its rank (record.h's ShardSpec), so rank r trains the records whose index in the epoch's
// reading sequence is r modulo the world size: record counts per rank differ by at most one,
// however uneven the record sizes (a byte-balanced split gave one rank a few huge records and
// another hundreds of small ones, and the shortest rank sets every rank's steps). The cost:
// every rank reads every byte and finds every record's end (a '\n' for JSON Lines and text,
// the quote-aware scan for CSV), but parses, tokenizes and trains only its own share. Chunks
// exist for the per-epoch shuffle of the reading order.
//
// Where a cut lands: the planner picks approximate offsets (equal byte shares) and moves each
// to the first record start at or after it.
//  - JSON Lines and text: a record starts after '\n' (JSON strings cannot hold a raw newline).
//  - CSV: a '\n' ends a record only outside quotes, and quote parity cannot be known from an
//    arbitrary offset. The planner runs the RFC 4180 machine (csv_syntax.h) from the byte
//    before the cut under every possible starting state at once and drops a hypothesis when
//    it breaks RFC 4180 (a stray quote, text after a closing quote), when a complete record
//    has a field count other than the header's, when it stays inside one quoted field longer
//    than max_record_bytes, or when it ends inside quotes. Once the survivors have merged into
//    one state and agree on the first record end, that is the cut. If they never agree (or all
//    die: a malformed file) within the scan limit, the planner falls back to an exact
//    sequential parse from the previous cut. Limits: exact for well-formed files whose quoted
//    fields are shorter than max_record_bytes; a malformed region near a cut costs a
//    sequential scan from the previous cut, and there the cut follows the lenient parse that
//    the reader also uses, so shards still tile the file.
//  - Parquet: shards are row ranges read from the footer only (SplitParquetFile in
//    shard_planner.cc): row-group boundaries when the file has at least as many row groups as
//    shards, else equal row shares inside row groups. PlanShards balances them by rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/byte_range_file.h"
#include "common/dataset/record.h"

namespace qlora::data {

// What the cut search did (for tests and logs).
struct CutStats {
  int64_t speculative_cuts = 0;  // CSV cuts decided by the hypotheses
  int64_t sequential_cuts = 0;   // CSV cuts that fell back to a parse from the previous cut
  int64_t bytes_scanned = 0;     // bytes read by the search, all formats
};

struct ShardPlanOptions {
  DatasetFormat format = DatasetFormat::kAuto;  // as DataConfig::format
  int64_t max_record_bytes = 1 << 20;   // CSV resync bound; the readers' record limit too
  CutStats* stats = nullptr;            // optional, filled when set
  // PlanShards: a file is cut into ceil(size / chunk_bytes) chunks, at most max_chunks_per_file.
  int64_t chunk_bytes = 16 << 20;
  int max_chunks_per_file = 1024;
};

// The first record start at or after `offset` (file size if none). `known_start` must be a
// record start <= offset (the fallback scans from there). For CSV, `header_fields` is the
// header's column count.
absl::StatusOr<int64_t> FindRecordStart(ByteRangeFile& file, DataFormat format, int64_t offset,
                                        int64_t known_start, int header_fields,
                                        const ShardPlanOptions& options);

// Where data records begin (after the CSV header; 0 otherwise), the header's column count
// (CSV; 0 otherwise) and the number of lines the header spans.
struct DataStart {
  int64_t offset = 0;
  int header_fields = 0;
  int64_t header_lines = 0;
};
absl::StatusOr<DataStart> FindDataStart(ByteRangeFile& file, DataFormat format);

// Splits one file into at most `num_shards` non-empty shards that tile its data records.
absl::StatusOr<std::vector<ShardSpec>> SplitFile(const std::string& path, int num_shards,
                                                 const ShardPlanOptions& options = {});

// The record-interleaved plan (see the file comment): result[rank] lists every chunk of every
// file in file order, with stride = world_size and phase = rank. Deterministic for the same
// files. An empty file has no chunk; a rank gets no record when the data has fewer records than
// ranks (the loader's epoch plan then says so).
absl::StatusOr<std::vector<std::vector<ShardSpec>>> PlanShards(
    const std::vector<std::string>& paths, int world_size, const ShardPlanOptions& options = {});

}  // namespace qlora::data
