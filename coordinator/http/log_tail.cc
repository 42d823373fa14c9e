// The tail of a log file (see log_tail.h).
#include "coordinator/http/log_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace qlora::coordinator {

absl::StatusOr<std::string> ReadLogTail(const std::string& path, int64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::string();
    return absl::FailedPreconditionError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  const int64_t start = std::max<int64_t>(0, st.st_size - max_bytes);
  std::string data(static_cast<size_t>(st.st_size - start), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = pread(fd, data.data() + got, data.size() - got, start + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  data.resize(got);
  if (start > 0) {
    // Begin at a whole line.
    const size_t newline = data.find('\n');
    data.erase(0, newline == std::string::npos ? 0 : newline + 1);
  }
  return data;
}

}  // namespace qlora::coordinator
