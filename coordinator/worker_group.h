// The worker processes of one job start: per rank its startup token, slot, pid, last heartbeat,
// whether it reported success and whether it has been reaped. Launches them through the
// ProcessLauncher, stops them (SIGTERM, then SIGKILL to whatever is left after a grace), and
// reaps their exits. It decides nothing about the job: JobManager reads what happened and
// changes the job's state.
//
// Not thread-safe: JobManager keeps each group under its lock. Launch runs on the monitor
// thread only (see ProcessLauncher::Launch).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/process_launcher.h"

namespace qlora::coordinator {

struct WorkerProcess {
  int rank = 0;
  std::string token;                 // the startup token the worker authenticates with
  int slot = 0;                      // GPU id or CPU slot number
  pid_t pid = 0;
  bool completed = false;            // reported success
  bool exited = false;               // reaped
  absl::Time last_heartbeat;
};

// One worker's exit, as Reap found it.
struct WorkerExit {
  int rank = 0;
  pid_t pid = 0;
  int slot = 0;
  bool completed = false;            // it had reported success
  ExitInfo info;
};

class WorkerGroup {
 public:
  explicit WorkerGroup(ProcessLauncher* launcher) : launcher_(launcher) {}

  bool empty() const { return workers_.empty(); }
  int size() const { return static_cast<int>(workers_.size()); }
  const std::vector<WorkerProcess>& workers() const { return workers_; }

  // Starts rank `rank` (ranks are added in order) with `spec`; its heartbeat clock starts `now`.
  absl::Status Launch(int rank, int slot, std::string token, const LaunchSpec& spec, absl::Time now);
  // The worker holding `token`, or nullptr.
  WorkerProcess* FindByToken(const std::string& token);

  // Polls every live worker once; returns those that ended since the last call (now reaped).
  std::vector<WorkerExit> Reap();
  bool AnyAlive() const;
  bool AllCompleted() const;
  // The first live worker that has not completed and was last heard of before `cutoff`.
  const WorkerProcess* SilentSince(absl::Time cutoff) const;
  void TouchAll(absl::Time now);

  // SIGTERM to every live worker; SIGKILL to those still alive at `kill_at` (KillOverdue).
  // Only the first Stop or ExpectExit counts.
  void Stop(absl::Time kill_at);
  // The workers are ending on their own: SIGKILL to those still alive at `kill_at`.
  void ExpectExit(absl::Time kill_at);
  bool stopping() const { return stopping_; }
  void KillOverdue(absl::Time now);
  // SIGKILL to every live worker (the coordinator is stopping).
  void KillAll() { SignalAlive(SIGKILL); }
  // Reaps every worker, waiting up to about a second for each (call after KillAll).
  void ReapKilled();

 private:
  void SignalAlive(int signal);

  ProcessLauncher* launcher_;
  std::vector<WorkerProcess> workers_;
  bool stopping_ = false;
  absl::Time kill_at_ = absl::InfiniteFuture();
};

}  // namespace qlora::coordinator
