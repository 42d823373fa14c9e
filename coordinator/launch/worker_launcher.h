// Where a job's workers run, behind one interface: start every rank of a job, ask them to stop,
// kill them, learn of each rank's end (and where it ran), and say what the placement can hold.
// JobManager and Job know nothing else about processes, pids, signals or hosts.
//
// Implementations:
//   - LocalWorkerLauncher (local_worker_launcher.h): child processes of the coordinator, one per
//     GPU or CPU slot; the embedded default.
//   - RayWorkerLauncher (ray/ray_worker_launcher.h): one Ray job per start on a Ray cluster, whose
//     driver (deploy/ray/qlora_ray_launcher.py) reserves a placement group and runs every rank.
// A third (a Kubernetes-native or Slurm launcher) implements the same two classes; see
// coordinator/README.md.
//
// Thread-safety: JobManager calls a launcher and its groups under its lock, so no method may
// block on the network or the file system for long (the Ray launcher does its HTTP calls on a
// thread of its own and answers from what that thread last saw).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/config_enums.h"

namespace qlora::coordinator {

// How to run one process: its command line, environment and log file.
struct LaunchSpec {
  std::vector<std::string> argv;             // argv[0] is the executable path
  std::map<std::string, std::string> env;    // added to (and overriding) the inherited ones
  std::string log_path;                      // stdout and stderr go here (appended)
};

// How a rank ended.
struct ExitInfo {
  bool signaled = false;
  int code = 0;                              // exit status, or the signal number
  std::string cause;                         // set when no exit status is known (a lost node)
  std::string Describe() const;              // "exit status 3" / "signal 9 (Killed)" / cause
};

struct RankLaunch {
  int rank = 0;
  int slot = 0;                              // local GPU id or CPU slot; unused on a cluster
  LaunchSpec spec;
};

// Everything one start of a job runs.
struct GroupLaunch {
  std::string job_id;
  std::string job_uid;                       // a stale start of the same job can be found by it
  int64_t generation = 0;                    // distinguishes the starts of one job
  bool use_gpu = false;
  int cpus_per_worker = 1;                   // cluster bundles: {GPU: 1, CPU: n} or {CPU: n}
  PlacementStrategy placement = PlacementStrategy::kPack;  // one bundle per rank
  std::vector<RankLaunch> ranks;             // in rank order
};

// One rank's end, as a launcher observed it.
struct RankEnd {
  int rank = 0;
  std::string where;                         // "pid 123" or "host 10.0.0.2, pid 123"
  ExitInfo info;
};

// The running ranks of one start.
class LaunchedGroup {
 public:
  virtual ~LaunchedGroup() = default;
  // Where `rank` runs, for messages ("pid 123"); empty until known.
  virtual std::string Where(int rank) const = 0;
  // Non-blocking: the ranks that ended since the last call, each reported once.
  virtual std::vector<RankEnd> Poll() = 0;
  // Asks every rank to end (SIGTERM; a stop of the Ray job).
  virtual void Terminate() = 0;
  // Ends every rank now (SIGKILL).
  virtual void Kill() = 0;
  // After Kill, while the coordinator shuts down: waits a little for the ends to be observed
  // so that nothing is left behind (zombies, a Ray job still running).
  virtual void AwaitKilled() = 0;
};

// What a launcher can place.
struct LauncherCapacity {
  int gpus = 0;                              // GPUs in total (0: none)
  int cpus = 0;                              // CPU cores in total
  int hosts = 0;                             // the hosts (cluster nodes) they are on
  bool known = false;                        // false: not learnt yet (a cluster not reached)
};

class WorkerLauncher {
 public:
  virtual ~WorkerLauncher() = default;
  // Starts every rank. On an error nothing of this start is left running.
  virtual absl::StatusOr<std::unique_ptr<LaunchedGroup>> Launch(const GroupLaunch& launch) = 0;
  // For messages and `qloractl validate`: "local processes", "the Ray cluster at http://...".
  virtual std::string Describe() const = 0;
  virtual LauncherCapacity Capacity() const = 0;
};

}  // namespace qlora::coordinator
