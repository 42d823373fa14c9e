// What a job's start needs from the file system, done by the monitor thread WITHOUT the job
// manager's lock: the per-rank shards planned from the job's datasets (which reads them) and
// the log and output folders (the output folder may be any path the job names). Either can be
// slow or, on a hostile file, block; while the lock is held no client could be answered.
//
// JobManager copies a StartRequest under its lock, releases it, calls PrepareStart, and takes
// the lock again to start the job only if it is still the one the FIFO would start.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "coordinator/jobs/shard_plan.h"

namespace qlora::coordinator {

// A copy of what a start needs, so that PrepareStart reads nothing the lock guards.
struct StartRequest {
  std::string job_id;
  std::vector<int> slots;  // slots[rank]; free when the request was made
  DataConfig data;
  int world_size = 0;
  std::string log_dir;
  std::string output_dir;
  std::vector<std::string> read_roots;  // the planner reads beneath these (empty: anywhere)
};

// Plans the shards (PlanJobShards) and creates the log and output folders. Thread-safe; blocks
// on the file system as long as it takes.
absl::StatusOr<JobShards> PrepareStart(const StartRequest& request);

}  // namespace qlora::coordinator
