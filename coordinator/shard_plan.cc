// Per-rank shard planning for a job (see shard_plan.h).
#include "coordinator/shard_plan.h"

#include "absl/strings/str_split.h"
#include "common/dataset/shard_planner.h"

namespace qlora::coordinator {

// Several shards per rank: the worker shuffles shard order per epoch, and a resume on a
// different number of ranks re-plans from the same files.
constexpr int kShardsPerRank = 4;

absl::StatusOr<std::vector<std::vector<data::ShardSpec>>> PlanShardsForRanks(const std::string& paths,
                                                                        DatasetFormat format,
                                                                        int world_size) {
  std::vector<std::string> files = absl::StrSplit(paths, ',', absl::SkipEmpty());
  data::ShardPlanOptions options;
  options.format = format;
  return data::PlanShards(files, world_size, kShardsPerRank, options);
}

}  // namespace qlora::coordinator
