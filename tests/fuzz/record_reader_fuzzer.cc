// Fuzz target: the dataset record readers (JSON Lines, CSV, text) and the shard planner. The
// first byte picks the format, the malformed-record policy, the shard count (1-8) and a small
// record limit; the rest is the file (a memfd). The file is read whole as one shard, then split
// by SplitFile and read shard by shard. When the whole file has no malformed record, the
// shards must give exactly its records (shard_planner.h: exact for well-formed files).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/dataset/record_reader.h"
#include "common/dataset/shard_planner.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

using qlora::data::Record;

struct Read {
  bool ok = true;
  int64_t malformed = 0;
  std::vector<Record> records;
};

// Appends every record of `shard` to *into; stops at the first error (a "fail" policy refusal
// or I/O).
void ReadShard(const qlora::data::ShardSpec& shard, const qlora::data::ReaderOptions& options,
               Read* into) {
  absl::StatusOr<std::unique_ptr<qlora::data::RecordReader>> reader =
      qlora::data::RecordReader::Open(shard, options);
  if (!reader.ok()) {
    into->ok = false;
    return;
  }
  Record record;
  for (int guard = 0; guard < 1 << 20; ++guard) {
    absl::StatusOr<bool> more = (*reader)->Next(&record);
    if (!more.ok()) {
      into->ok = false;
      break;
    }
    if (!*more) break;
    into->records.push_back(record);
  }
  into->malformed += (*reader)->malformed_count();
}

bool SameRecords(const std::vector<Record>& a, const std::vector<Record>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].fields != b[i].fields || a[i].offset != b[i].offset) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  static constexpr qlora::DatasetFormat kFormats[] = {
      qlora::DatasetFormat::kJsonl, qlora::DatasetFormat::kCsv, qlora::DatasetFormat::kText,
      qlora::DatasetFormat::kCsv};
  qlora::data::ShardPlanOptions plan;
  plan.format = kFormats[control & 3];
  qlora::data::ReaderOptions options;
  options.format = control % 4 == 0 ? qlora::data::DataFormat::kJsonl
                   : control % 4 == 2 ? qlora::data::DataFormat::kText
                                      : qlora::data::DataFormat::kCsv;
  options.skip_malformed = (control & 4) != 0;
  const int num_shards = 1 + ((control >> 3) & 7);
  if (control & 0x40) options.max_record_bytes = plan.max_record_bytes = 64;

  qlora::fuzz::FuzzFile file(data + 1, size - 1);
  const int64_t file_size = static_cast<int64_t>(size - 1);
  Read whole;
  ReadShard({file.path(), 0, file_size, 1}, options, &whole);

  absl::StatusOr<std::vector<qlora::data::ShardSpec>> shards =
      qlora::data::SplitFile(file.path(), num_shards, plan);
  if (!shards.ok()) return 0;
  Read parts;
  int64_t cursor = -1;
  for (const qlora::data::ShardSpec& shard : *shards) {
    if (shard.begin >= shard.end || shard.end > file_size || shard.begin < cursor) {
      std::fprintf(stderr, "bad shard [%lld, %lld) of a %lld-byte file\n",
                   static_cast<long long>(shard.begin), static_cast<long long>(shard.end),
                   static_cast<long long>(file_size));
      std::abort();
    }
    cursor = shard.end;
    ReadShard(shard, options, &parts);
  }
  if (whole.ok && whole.malformed == 0 && options.skip_malformed &&
      !(parts.malformed == 0 && SameRecords(whole.records, parts.records))) {
    std::fprintf(stderr, "the %zu shards read %zu records (%lld malformed); the whole file %zu\n",
                 shards->size(), parts.records.size(), static_cast<long long>(parts.malformed),
                 whole.records.size());
    std::abort();
  }
  return 0;
}
