// Splits a job's dataset into per-rank byte-range shards at record boundaries. The planning
// itself is the data path's (common/dataset/shard_planner.h); this adapts it to a job's fields.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dataset/record.h"

namespace qlora::coordinator {


// result[rank] = that rank's shards. `paths` is one file or a comma-separated list of files;
// `format` is DataConfig::format.
absl::StatusOr<std::vector<std::vector<data::ShardSpec>>> PlanShardsForRanks(const std::string& paths,
                                                                        DatasetFormat format,
                                                                        int world_size);

}  // namespace qlora::coordinator
