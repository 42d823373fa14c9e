// Buffered pread over a byte range (see byte_range_file.h).
#include "common/dataset/byte_range_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace qlora::data {

absl::StatusOr<int> OpenRegularFile(const std::string& path, int64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  *size = static_cast<int64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::unique_ptr<ByteRangeFile>> ByteRangeFile::Open(const std::string& path,
                                                                  size_t buffer_bytes) {
  int64_t size = 0;
  absl::StatusOr<int> opened = OpenRegularFile(path, &size);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<ByteRangeFile>(
      new ByteRangeFile(path, fd, size, buffer_bytes));
}

ByteRangeFile::ByteRangeFile(std::string path, int fd, int64_t size, size_t buffer_bytes)
    : path_(std::move(path)), fd_(fd), size_(size), limit_(size), buffer_(buffer_bytes) {}

ByteRangeFile::~ByteRangeFile() { ::close(fd_); }

void ByteRangeFile::Seek(int64_t offset, int64_t limit) {
  limit_ = std::min(limit, size_);
  int64_t in_buffer = offset - buffer_offset_;
  if (in_buffer >= 0 && in_buffer <= static_cast<int64_t>(len_) &&
      buffer_offset_ + static_cast<int64_t>(len_) <= limit_) {
    pos_ = static_cast<size_t>(in_buffer);  // keep the buffered bytes
    return;
  }
  buffer_offset_ = offset;
  pos_ = len_ = 0;
}

bool ByteRangeFile::Fill() {
  buffer_offset_ += static_cast<int64_t>(len_);
  pos_ = len_ = 0;
  int64_t want = std::min<int64_t>(static_cast<int64_t>(buffer_.size()), limit_ - buffer_offset_);
  if (want <= 0 || !status_.ok()) return false;
  ssize_t got;
  do {
    got = ::pread(fd_, buffer_.data(), static_cast<size_t>(want), buffer_offset_);
  } while (got < 0 && errno == EINTR);
  if (got < 0) {
    status_ = absl::DataLossError(absl::StrCat("read ", path_, ": ", std::strerror(errno)));
    return false;
  }
  len_ = static_cast<size_t>(got);
  return got > 0;
}

bool ByteRangeFile::ReadLine(std::string* line, size_t max_bytes, bool* truncated) {
  bool any = false;
  size_t appended = 0;
  if (truncated) *truncated = false;
  while (true) {
    if (pos_ == len_ && !Fill()) return any;
    const char* start = buffer_.data() + pos_;
    const void* nl = std::memchr(start, '\n', len_ - pos_);
    size_t n = nl ? static_cast<const char*>(nl) - start + 1 : len_ - pos_;
    size_t keep = std::min(n, max_bytes - appended);
    line->append(start, keep);
    appended += keep;
    if (keep < n && truncated) *truncated = true;
    pos_ += n;
    any = true;
    if (nl) return true;
  }
}

absl::StatusOr<int64_t> CountNewlines(ByteRangeFile& file, int64_t begin, int64_t end) {
  file.Seek(begin, end);
  int64_t count = 0;
  std::string chunk;
  while (file.ReadLine(&chunk, 0)) count += 1;
  if (!file.status().ok()) return file.status();
  // The last chunk counts only if it ended with '\n'.
  if (end > begin) {
    file.Seek(end - 1, end);
    if (file.Get() != '\n') --count;
  }
  return count;
}
}  // namespace qlora::data
