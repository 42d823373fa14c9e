// Plans which records of a job's datasets each rank reads: byte-range chunks cut at record
// boundaries, every rank reading every chunk and keeping every world-size-th record (balanced
// by records, not bytes). The planning itself is the data path's
// (common/dataset/shard_planner.h); this adapts it to a job's fields.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "common/dataset/record.h"

namespace qlora::coordinator {

// result[rank] = that rank's shards. `paths` is one file or a comma-separated list of files;
// `format` is DataConfig::format; `max_record_bytes` the readers' record bound
// (data::MaxRecordBytesForRows), which also bounds the CSV planner's search for a record start.
absl::StatusOr<std::vector<std::vector<data::ShardSpec>>> PlanShardsForRanks(const std::string& paths,
                                                                        DatasetFormat format,
                                                                        int world_size,
                                                                        int64_t max_record_bytes);

// Every rank's shards of one job: train[rank], validation[rank] (empty lists when the job has no
// validation file).
struct JobShards {
  std::vector<std::vector<data::ShardSpec>> train;
  std::vector<std::vector<data::ShardSpec>> validation;
};

// Plans the training and validation files of `data` for `world_size` ranks. Every rank runs the
// same collectives, so every rank needs data of each kind the job uses: FAILED_PRECONDITION when
// a file has fewer records than ranks (counted from the start, only up to the world size).
// With `read_roots`, every file is read through a descriptor opened beneath them
// (admission/confined_open.h), so no link can lead the planner out at the moment it reads; the
// shards name the files as the job does. (A list whose files are of different formats by name
// is planned by path.)
absl::StatusOr<JobShards> PlanJobShards(const DataConfig& data, int world_size,
                                        const std::vector<std::string>& read_roots = {});

}  // namespace qlora::coordinator
