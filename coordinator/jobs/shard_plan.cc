// Per-rank shard planning for a job (see shard_plan.h).
#include "coordinator/jobs/shard_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/dataset/record_reader.h"
#include "common/dataset/shard_planner.h"
#include "common/status_macros.h"

namespace qlora::coordinator {
namespace {

// The records of `chunks` (every chunk of the files, as each rank's plan lists them), counted
// from the start up to `limit`: reads only until it has seen that many (malformed ones count:
// a rank reports them), so a large file costs a few records.
absl::StatusOr<int64_t> CountRecordsUpTo(std::vector<data::ShardSpec> chunks, DatasetFormat format,
                                         int64_t limit) {
  int64_t count = 0;
  for (data::ShardSpec& chunk : chunks) {
    chunk.stride = 1;
    chunk.phase = 0;
    data::ReaderOptions options;
    QLORA_ASSIGN_OR_RETURN(options.format, data::ResolveFormat(format, chunk.path));
    options.skip_malformed = true;
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
                                                                        int world_size) {
  std::vector<std::string> files = absl::StrSplit(paths, ',', absl::SkipEmpty());
  data::ShardPlanOptions options;
  options.format = format;
  return data::PlanShards(files, world_size, options);
}

absl::StatusOr<JobShards> PlanJobShards(const DataConfig& data, int world_size) {
  JobShards shards;
  QLORA_ASSIGN_OR_RETURN(shards.train, PlanShardsForRanks(data.train_path, data.format, world_size));
  shards.validation.assign(world_size, {});
  const bool validate = !data.validation_path.empty();
  if (validate) {
    QLORA_ASSIGN_OR_RETURN(shards.validation,
                           PlanShardsForRanks(data.validation_path, data.format, world_size));
  }
  // Every rank reads every chunk and keeps every world_size-th record: each needs one at least.
  QLORA_ASSIGN_OR_RETURN(const int64_t train_records,
                         CountRecordsUpTo(shards.train[0], data.format, world_size));
  if (train_records < world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the dataset is too small: ", train_records, " record(s) for ", world_size,
        " workers, and each worker needs one at least (", data.train_path, ")"));
  }
  if (validate) {
    QLORA_ASSIGN_OR_RETURN(const int64_t validation_records,
                           CountRecordsUpTo(shards.validation[0], data.format, world_size));
    if (validation_records < world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the validation file is too small: ", validation_records, " record(s) for ", world_size,
          " workers (", data.validation_path, ")"));
    }
  }
  return shards;
}

}  // namespace qlora::coordinator
