// A start's file-system work, done outside the job manager's lock (see start_prep.h).
#include "coordinator/jobs/start_prep.h"

#include "common/posix_files.h"
#include "common/status_macros.h"

namespace qlora::coordinator {

absl::StatusOr<JobShards> PrepareStart(const StartRequest& request) {
  QLORA_ASSIGN_OR_RETURN(JobShards shards, PlanJobShards(request.data, request.world_size, request.read_roots));
  QLORA_RETURN_IF_ERROR(MakeDirs(request.log_dir));
  QLORA_RETURN_IF_ERROR(MakeDirs(request.output_dir));
  return shards;
}

}  // namespace qlora::coordinator
