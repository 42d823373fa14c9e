// Per-rank shard planning for a job (see shard_plan.h).
#include "coordinator/jobs/shard_plan.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/dataset/record_reader.h"
#include "common/dataset/shard_planner.h"
#include "common/status_macros.h"
#include "coordinator/admission/confined_open.h"

namespace qlora::coordinator {
namespace {

// The records of `chunks` (every chunk of the files, as each rank's plan lists them), counted
// from the start up to `limit`: reads only until it has seen that many (malformed ones count:
// a rank reports them), so a large file costs a few records.
absl::StatusOr<int64_t> CountRecordsUpTo(std::vector<data::ShardSpec> chunks, DatasetFormat format,
                                         int64_t max_record_bytes, int64_t limit) {
  int64_t count = 0;
  for (data::ShardSpec& chunk : chunks) {
    chunk.stride = 1;
    chunk.phase = 0;
    data::ReaderOptions options;
    QLORA_ASSIGN_OR_RETURN(options.format, data::ResolveFormat(format, chunk.path));
    options.skip_malformed = true;
    options.max_record_bytes = max_record_bytes;
    QLORA_ASSIGN_OR_RETURN(auto reader, data::RecordReader::Open(chunk, options));
    data::Record record;
    while (count + reader->malformed_count() < limit) {
      QLORA_ASSIGN_OR_RETURN(bool more, reader->Next(&record));
      if (!more) break;
      ++count;
    }
    count += reader->malformed_count();
    if (count >= limit) break;
  }
  return count;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<data::ShardSpec>>> PlanShardsForRanks(const std::string& paths,
                                                                        DatasetFormat format,
                                                                        int world_size,
                                                                        int64_t max_record_bytes) {
  std::vector<std::string> files = absl::StrSplit(paths, ',', absl::SkipEmpty());
  data::ShardPlanOptions options;
  options.format = format;
  options.max_record_bytes = max_record_bytes;
  return data::PlanShards(files, world_size, options);
}

namespace {

// The files of `data` as descriptors opened beneath the roots: each list rewritten to their
// /proc/self/fd paths (with the one format its files have by name made explicit), and the map
// back to the names the job uses.
struct ConfinedLists {
  DataConfig data;
  std::vector<ConfinedFile> held;            // open while the planner reads
  std::map<std::string, std::string> named;  // /proc/self/fd/N -> the job's path
};

absl::Status ConfineList(std::string* list, DatasetFormat* format, DatasetFormat written,
                         const std::vector<std::string>& roots, ConfinedLists* out) {
  if (list->empty()) return absl::OkStatus();
  const std::vector<std::string> files = absl::StrSplit(*list, ',', absl::SkipEmpty());
  std::optional<data::DataFormat> common;
  for (const std::string& file : files) {
    QLORA_ASSIGN_OR_RETURN(const data::DataFormat f, data::ResolveFormat(written, file));
    if (common && *common != f) return absl::OkStatus();  // mixed formats: planned by path
    common = f;
  }
  std::vector<std::string> opened;
  for (const std::string& file : files) {
    QLORA_ASSIGN_OR_RETURN(ConfinedFile confined, ConfinedFile::Open(file, roots));
    opened.push_back(confined.path_for_readers());
    out->named[opened.back()] = file;
    out->held.push_back(std::move(confined));
  }
  *list = absl::StrJoin(opened, ",");
  *format = static_cast<DatasetFormat>(static_cast<int>(*common) + 1);  // kJsonl... after kAuto
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobShards> PlanJobShards(const DataConfig& written, int world_size,
                                        const std::vector<std::string>& read_roots) {
  static_assert(static_cast<int>(DatasetFormat::kParquet) ==
                static_cast<int>(data::DataFormat::kParquet) + 1);
  ConfinedLists confined;
  confined.data = written;
  DatasetFormat train_format = written.format, validation_format = written.format;
  if (!read_roots.empty()) {
    QLORA_RETURN_IF_ERROR(ConfineList(&confined.data.train_path, &train_format, written.format,
                                      read_roots, &confined));
    QLORA_RETURN_IF_ERROR(ConfineList(&confined.data.validation_path, &validation_format,
                                      written.format, read_roots, &confined));
  }
  const DataConfig& data = confined.data;
  const int64_t record_bytes = data::MaxRecordBytesForRows(data.max_sequence_length);
  JobShards shards;
  QLORA_ASSIGN_OR_RETURN(shards.train,
                         PlanShardsForRanks(data.train_path, train_format, world_size, record_bytes));
  shards.validation.assign(world_size, {});
  const bool validate = !data.validation_path.empty();
  if (validate) {
    QLORA_ASSIGN_OR_RETURN(shards.validation,
                           PlanShardsForRanks(data.validation_path, validation_format, world_size,
                                              record_bytes));
  }
  // Every rank reads every chunk and keeps every world_size-th record: each needs one at least.
  QLORA_ASSIGN_OR_RETURN(const int64_t train_records,
                         CountRecordsUpTo(shards.train[0], train_format, record_bytes, world_size));
  if (train_records < world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the dataset is too small: ", train_records, " record(s) for ", world_size,
        " workers, and each worker needs one at least (", written.train_path, ")"));
  }
  if (validate) {
    QLORA_ASSIGN_OR_RETURN(const int64_t validation_records,
                           CountRecordsUpTo(shards.validation[0], validation_format, record_bytes,
                                            world_size));
    if (validation_records < world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the validation file is too small: ", validation_records, " record(s) for ", world_size,
          " workers (", written.validation_path, ")"));
    }
  }
  // The workers open the files by the job's names.
  for (auto* kind : {&shards.train, &shards.validation}) {
    for (std::vector<data::ShardSpec>& rank : *kind) {
      for (data::ShardSpec& spec : rank) {
        if (auto it = confined.named.find(spec.path); it != confined.named.end()) spec.path = it->second;
      }
    }
  }
  return shards;
}

}  // namespace qlora::coordinator
