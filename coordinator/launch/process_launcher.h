// Starts and stops local processes, by pid: the POSIX machinery under LocalWorkerLauncher. The
// real launcher forks and execs each worker in its own process group, with a parent-death
// signal so no worker outlives the coordinator, and its stdout/stderr appended to a log file.
// Tests may inject another ProcessLauncher.
#pragma once

#include <sys/types.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;
  virtual absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) = 0;
  // Call Launch from one long-lived thread: the parent-death signal fires when the thread that
  // forked the process ends, not only the process.
  // Non-blocking: the exit of `pid` if it has ended (and reaps it), nullopt while it runs.
  virtual std::optional<ExitInfo> Poll(pid_t pid) = 0;
  // Sends `signal` to the process group of `pid`.
  virtual void Signal(pid_t pid, int signal) = 0;
};

class PosixProcessLauncher : public ProcessLauncher {
 public:
  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) override;
  std::optional<ExitInfo> Poll(pid_t pid) override;
  void Signal(pid_t pid, int signal) override;
};

}  // namespace qlora::coordinator
