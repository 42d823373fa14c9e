// openat2(RESOLVE_BENEATH) from a read root's descriptor (confined_open.h).
#include "coordinator/admission/confined_open.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/admission/path_confinement.h"

namespace qlora::coordinator {
namespace {

absl::Status OpenError(const std::string& path, int error) {
  const std::string message = absl::StrCat(path, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<ConfinedFile> ConfinedFile::Open(const std::string& path,
                                                const std::vector<std::string>& roots) {
  bool leads_out = false;
  absl::StatusOr<ConfinedFile> opened = OpenAsNamed(path, roots, &leads_out);
  if (opened.ok() || !leads_out) return opened;
  // RESOLVE_BENEATH refuses every absolute link, also one that points inside a root: try once
  // more by the path's resolution, opened beneath the roots again (a link met on the way now,
  // after a swap, is refused as before).
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr || path == resolved) return opened;
  absl::StatusOr<ConfinedFile> again = OpenAsNamed(resolved, roots, &leads_out);
  if (again.ok()) return again;
  return opened;
}

absl::StatusOr<ConfinedFile> ConfinedFile::OpenAsNamed(const std::string& path,
                                                       const std::vector<std::string>& roots,
                                                       bool* leads_out) {
  *leads_out = false;
  if (roots.empty()) {
    const int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
    if (fd < 0) return OpenError(path, errno);
    return ConfinedFile(fd);
  }
  for (const std::string& root : roots) {
    const std::string prefix = root == "/" ? "/" : root + "/";
    if (!absl::StartsWith(path, prefix) || path.size() == prefix.size()) continue;
    const int root_fd = open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) return OpenError(root, errno);
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    const std::string relative = path.substr(prefix.size());
    const long fd = syscall(SYS_openat2, root_fd, relative.c_str(), &how, sizeof(how));
    const int error = errno;
    close(root_fd);
    if (fd >= 0) return ConfinedFile(static_cast<int>(fd));
    if (error != EXDEV) return OpenError(path, error);
    *leads_out = true;  // a link or `..` on the way leaves this root: try the next one
  }
  return OutsideReadRoots(path, *leads_out ? "leads out of" : "lies outside", roots);
}

ConfinedFile::ConfinedFile(ConfinedFile&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

ConfinedFile& ConfinedFile::operator=(ConfinedFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ConfinedFile::~ConfinedFile() {
  if (fd_ >= 0) close(fd_);
}

std::string ConfinedFile::path_for_readers() const { return absl::StrCat("/proc/self/fd/", fd_); }

}  // namespace qlora::coordinator
