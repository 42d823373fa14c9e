// Starts and stops worker processes. The real launcher forks and execs each worker in its own
// process group, with a parent-death signal so no worker outlives the coordinator, and its
// stdout/stderr appended to a log file. Tests may inject another ProcessLauncher.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace qlora::coordinator {

struct LaunchSpec {
  std::vector<std::string> argv;             // argv[0] is the executable path
  std::map<std::string, std::string> env;    // added to (and overriding) the coordinator's
  std::string log_path;                      // stdout and stderr go here (appended)
};

// How a process ended, as waitpid reported it.
struct ExitInfo {
  bool signaled = false;
  int code = 0;                              // exit status, or the signal number
  std::string Describe() const;              // "exit status 3" / "signal 9 (Killed)"
};

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
