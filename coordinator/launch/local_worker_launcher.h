// The embedded default WorkerLauncher: every rank is a child process of the coordinator on this
// host (through a ProcessLauncher), in its own process group, its output in its log file; the
// GPU or CPU slot it uses was chosen by the caller (JobManager's SlotPool).
//
// Guarantees: Launch starts every rank or, on an error, kills and reaps the ones it started;
// Terminate is SIGTERM to each live rank's process group, Kill is SIGKILL; Poll reaps with
// waitpid, so a rank's end is its real exit status or signal. Not thread-safe (JobManager's lock).
#pragma once

#include <memory>
#include <string>

#include "coordinator/launch/process_launcher.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

class LocalWorkerLauncher : public WorkerLauncher {
 public:
  // `processes` outlives the launcher; `gpus` is the number of GPUs the coordinator was given.
  LocalWorkerLauncher(ProcessLauncher* processes, int gpus) : processes_(processes), gpus_(gpus) {}

  absl::StatusOr<std::unique_ptr<LaunchedGroup>> Launch(const GroupLaunch& launch) override;
  std::string Describe() const override { return "local processes on this host"; }
  LauncherCapacity Capacity() const override;

 private:
  ProcessLauncher* processes_;
  int gpus_;
};

}  // namespace qlora::coordinator
