// Atomic, durable file writes (see atomic_file.h).
#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace qlora {

absl::Status FileError(absl::string_view what, absl::string_view path, int error_number) {
  const std::string message = absl::StrCat(what, " ", path, ": ", strerrorname_np(error_number), ": ",
                                           std::strerror(error_number));
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS: return absl::PermissionDeniedError(message);
    default: return absl::InternalError(message);
  }
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) status_ = FileError("cannot create", tmp_, errno);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) Abandon();
}

void AtomicFileWriter::Fail(const char* what) {
  if (status_.ok()) status_ = FileError(what, tmp_, errno);
}

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::Append(absl::string_view bytes) {
  while (status_.ok() && !bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      Fail("cannot write");
      return;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

absl::Status AtomicFileWriter::Commit() {
  if (status_.ok() && ::fsync(fd_) != 0) Fail("cannot flush");
  if (status_.ok()) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) Fail("cannot close");
  }
  if (status_.ok() && ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int error_number = errno;
    status_ = FileError(absl::StrCat("cannot rename ", tmp_, " to"), path_, error_number);
  }
  if (!status_.ok()) {
    Abandon();
    return status_;
  }
  committed_ = true;
  // The rename is durable once the folder is synced (best effort: some file systems refuse).
  const size_t slash = path_.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

}  // namespace qlora
