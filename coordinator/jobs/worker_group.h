// The workers of one start of a job: per rank its startup token, slot, where it runs, last
// heartbeat, whether it reported success and whether its end has been seen. Launches them
// through a WorkerLauncher (local processes or a cluster), stops them (Terminate, then Kill to
// whatever is left after a grace), and collects their ends. It decides nothing about the job:
// Job reads what happened and changes the job's state.
//
// Not thread-safe: JobManager keeps each group under its lock. Launch runs on the monitor
// thread only (see ProcessLauncher::Launch).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

struct WorkerProcess {
  int rank = 0;
  std::string token;                 // the startup token the worker authenticates with
  int slot = 0;                      // local GPU id or CPU slot number
  std::string where;                 // "pid 123", or "host 10.0.0.2, pid 123" once registered
  bool completed = false;            // reported success
  bool exited = false;               // its end was seen
  absl::Time last_heartbeat;
};

// One worker's end, as Reap found it.
struct WorkerExit {
  int rank = 0;
  std::string where;
  int slot = 0;
  bool completed = false;            // it had reported success
  ExitInfo info;
};

class WorkerGroup {
 public:
  bool empty() const { return workers_.empty(); }
  int size() const { return static_cast<int>(workers_.size()); }
  const std::vector<WorkerProcess>& workers() const { return workers_; }

  // Starts every rank of `launch` through `launcher`; tokens[r] is rank r's startup token. Its
  // heartbeat clock starts `now`. On an error no worker is added (the launcher left none running).
  absl::Status Launch(WorkerLauncher* launcher, const GroupLaunch& launch,
                      const std::vector<std::string>& tokens, absl::Time now);
  // The worker holding `token`, or nullptr.
  WorkerProcess* FindByToken(const std::string& token);

  // The ends seen since the last call (each once).
  std::vector<WorkerExit> Reap();
  bool AnyAlive() const;
  bool AllCompleted() const;
  // The first live worker that has not completed and was last heard of before `cutoff`.
  const WorkerProcess* SilentSince(absl::Time cutoff) const;
  void TouchAll(absl::Time now);

  // Terminate every live worker; Kill those still alive at `kill_at` (KillOverdue).
  // Only the first Stop or ExpectExit counts.
  void Stop(absl::Time kill_at);
  // The workers are ending on their own: Kill those still alive at `kill_at`.
  void ExpectExit(absl::Time kill_at);
  bool stopping() const { return stopping_; }
  void KillOverdue(absl::Time now);
  // Kill every live worker (the coordinator is stopping).
  void KillAll();
  // Waits a little for the killed workers' ends (call after KillAll).
  void ReapKilled();

 private:
  std::unique_ptr<LaunchedGroup> launched_;
  std::vector<WorkerProcess> workers_;
  bool stopping_ = false;
  bool killed_ = false;
  absl::Time kill_at_ = absl::InfiniteFuture();
};

}  // namespace qlora::coordinator
