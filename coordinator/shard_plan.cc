// Per-rank shard planning for a job (see shard_plan.h).
#include "coordinator/shard_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/dataset/shard_planner.h"
#include "common/status_macros.h"

namespace qlora::coordinator {

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
  for (int rank = 0; rank < world_size; ++rank) {
    if (shards.train[rank].empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the training data is empty (", data.train_path, ")"));
    }
    if (validate && shards.validation[rank].empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the validation data is empty (", data.validation_path, ")"));
    }
  }
  return shards;
}

}  // namespace qlora::coordinator
