// Buffered sequential reading of one byte range of a file with pread: constant memory (one
// buffer), no whole-file reads, and cheap random starts (the shard planner seeks with it).
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace qlora::data {

// Opens `path` for reading with O_NONBLOCK (a FIFO or a device put in a dataset's place must not
// block the open; it has no effect on a regular file's reads) and checks right after that it is
// a regular file. The descriptor (O_CLOEXEC) is the caller's; *size is the file's size.
// NOT_FOUND / PERMISSION_DENIED naming the file when it cannot be opened, INVALID_ARGUMENT when
// it is not a regular file.
absl::StatusOr<int> OpenRegularFile(const std::string& path, int64_t* size);

class ByteRangeFile {
 public:
  // INVALID_ARGUMENT when `path` is not a regular file (a FIFO or a device is opened without
  // blocking, then refused).
  static absl::StatusOr<std::unique_ptr<ByteRangeFile>> Open(const std::string& path,
                                                            size_t buffer_bytes = 1 << 16);
  ~ByteRangeFile();
  ByteRangeFile(const ByteRangeFile&) = delete;
  ByteRangeFile& operator=(const ByteRangeFile&) = delete;

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Positions the cursor at `offset`; reads then stop at `limit` (clamped to the file size).
  void Seek(int64_t offset, int64_t limit);
  int64_t position() const { return buffer_offset_ + static_cast<int64_t>(pos_); }

  // The next byte, or -1 at the limit; an I/O error is kept in status() and reads as the end.
  int Get() {
    if (pos_ == len_ && !Fill()) return -1;
    return static_cast<unsigned char>(buffer_[pos_++]);
  }
  // Consumes bytes up to and including the next '\n' (or to the limit) and appends at most
  // max_bytes of them to *line (*truncated tells when more were dropped); false when no byte
  // was left.
  bool ReadLine(std::string* line, size_t max_bytes = SIZE_MAX, bool* truncated = nullptr);
  const absl::Status& status() const { return status_; }

 private:
  ByteRangeFile(std::string path, int fd, int64_t size, size_t buffer_bytes);
  bool Fill();

  std::string path_;
  int fd_;
  int64_t size_;
  int64_t limit_ = 0;
  std::vector<char> buffer_;
  int64_t buffer_offset_ = 0;  // file offset of buffer_[0]
  size_t pos_ = 0;
  size_t len_ = 0;
  absl::Status status_;
};

// Counts '\n' bytes in [begin, end) of `file` (moves its cursor). Used only to name the file
// line of an error when the shard's first line is unknown.
absl::StatusOr<int64_t> CountNewlines(ByteRangeFile& file, int64_t begin, int64_t end);

}  // namespace qlora::data
