// flock(2) on the state folder's lock file (see state_lock.h).
#include "coordinator/store/state_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace qlora::coordinator {
namespace {

// The pid written in the lock file, or "unknown" (the holder may not have written it yet).
std::string HolderPid(int fd) {
  char buffer[32] = {};
  const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
  std::string pid = n > 0 ? std::string(absl::StripAsciiWhitespace(std::string(buffer, n))) : "";
  return pid.empty() ? "unknown" : pid;
}

absl::Status WritePid(int fd, const std::string& path) {
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string StateDirLock::LockPath(const std::string& state_dir) {
  return absl::StrCat(state_dir, "/coordinator.lock");
}

absl::StatusOr<StateDirLock> StateDirLock::Acquire(const std::string& state_dir) {
  const std::string path = LockPath(state_dir);
  // Hostile folder: no symlink is followed, and a FIFO planted there cannot block the open.
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  }
  StateDirLock lock(fd);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat("cannot lock ", path, ": ", strerror(errno)));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "state folder ", state_dir, " is in use by another qlora-coordinator (pid ", HolderPid(fd),
        ", lock ", path, "); stop it or give this one another --state-dir"));
  }
  if (absl::Status written = WritePid(fd, path); !written.ok()) return written;
  return lock;
}

StateDirLock& StateDirLock::operator=(StateDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace qlora::coordinator
