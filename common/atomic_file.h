// Writing a file so that readers see either the old file or the whole new one, never a part:
// the bytes go to <path>.tmp, which is flushed to disk (fsync) and renamed over <path>, and the
// folder is synced so the rename survives a power loss. A writer that is not committed (an
// error, an exception, an early return) removes its temporary file. Failures name the errno
// ("ENOSPC: No space left on device"), so a full disk is told as such in a job's failure.
// Torch-free, POSIX only.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace qlora {

class AtomicFileWriter {
 public:
  // Opens <path>.tmp for writing (mode 0644). Check status() before appending.
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // The first failure so far (OK while all went well).
  const absl::Status& status() const { return status_; }
  // Appends `bytes`; after a failure, does nothing.
  void Append(absl::string_view bytes);
  // fsync, close, rename over the target, fsync its folder. Returns the first failure of the
  // whole write; on failure the target is untouched and the temporary file removed.
  absl::Status Commit();

 private:
  void Fail(const char* what);
  void Abandon();

  const std::string path_;
  const std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
  absl::Status status_;
};

// The status for a failed system call on `path`: ENOSPC and EDQUOT are RESOURCE_EXHAUSTED,
// EACCES, EPERM and EROFS are PERMISSION_DENIED, the rest INTERNAL; the message names the errno
// ("cannot write /x/y: ENOSPC: No space left on device").
absl::Status FileError(absl::string_view what, absl::string_view path, int error_number);

}  // namespace qlora
