// The LaunchSpec of one worker process (see worker_launch.h).
#include "coordinator/launch/worker_launch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlora::coordinator {

std::string WorkerLogPath(const std::string& job_dir, int rank) {
  return absl::StrCat(job_dir, "/logs/rank-", rank, ".log");
}

LaunchSpec BuildWorkerLaunchSpec(const WorkerLaunchRequest& r) {
  LaunchSpec spec;
  spec.argv = {r.worker_binary, "--coordinator", r.coordinator_address, "--job", r.job_id,
               "--rank", std::to_string(r.rank)};
  // A secret never goes in argv (/proc/PID/cmdline is world-readable); the environment of a
  // process is readable by its owner alone.
  spec.env = r.extra_env;
  spec.env[kWorkerTokenVariable] = r.startup_token;
  if (r.use_gpu) {
    spec.env["CUDA_VISIBLE_DEVICES"] = std::to_string(r.slot);
    spec.argv.push_back("--device=cuda");
  } else {
    spec.env["CUDA_VISIBLE_DEVICES"] = "";
    spec.env["OMP_NUM_THREADS"] = std::to_string(std::max(1, r.threads_per_worker));
    spec.argv.push_back("--device=cpu");
  }
  if (!r.confine_read.empty()) {
    spec.argv.push_back(absl::StrCat("--confine_read=", absl::StrJoin(r.confine_read, ",")));
  }
  if (!r.confine_write.empty()) {
    spec.argv.push_back(absl::StrCat("--confine_write=", absl::StrJoin(r.confine_write, ",")));
  }
  spec.log_path = WorkerLogPath(r.job_dir, r.rank);
  return spec;
}

}  // namespace qlora::coordinator
