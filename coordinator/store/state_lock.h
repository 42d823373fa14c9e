// The exclusive lock on a coordinator's state folder: two coordinators on one folder would both
// number jobs from the same store and overwrite each other's records. The lock is a flock(2) on
// `<state>/coordinator.lock`, which holds the holder's pid (for the refusal message). The kernel
// drops it when the holder's process ends, however it ends, so a crash leaves no stale lock.
//
// Not thread-safe; one per process, held for its lifetime (move-only).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace qlora::coordinator {

class StateDirLock {
 public:
  // Takes the lock without waiting. FAILED_PRECONDITION naming the folder and the holder's pid
  // when another process holds it; another error when the lock file cannot be opened (e.g. it
  // is not a regular file).
  static absl::StatusOr<StateDirLock> Acquire(const std::string& state_dir);

  StateDirLock(StateDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  StateDirLock& operator=(StateDirLock&& other) noexcept;
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;
  ~StateDirLock();

  static std::string LockPath(const std::string& state_dir);

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace qlora::coordinator
