// A dataset file looked at by the coordinator beneath the read roots at the moment it is looked
// at: opened with openat2(RESOLVE_BENEATH) from the root folder's own descriptor, so no link or
// `..` met on the way can lead out, whatever the path named when it was checked. Opened O_PATH
// (no read, no side effect on a device or FIFO); fstat tells what it is, and readers that take a
// path (Arrow's Parquet reader) get /proc/self/fd/N, which reopens this very file.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace qlora::coordinator {

class ConfinedFile {
 public:
  // `path` absolute; `roots` the folders it must lie beneath (any of them; empty: anywhere, opened
  // as named). INVALID_ARGUMENT when the path leads out of every root, NOT_FOUND when it names
  // nothing.
  static absl::StatusOr<ConfinedFile> Open(const std::string& path,
                                           const std::vector<std::string>& roots);
  ConfinedFile(ConfinedFile&& other) noexcept;
  ConfinedFile& operator=(ConfinedFile&& other) noexcept;
  ConfinedFile(const ConfinedFile&) = delete;
  ConfinedFile& operator=(const ConfinedFile&) = delete;
  ~ConfinedFile();

  int fd() const { return fd_; }
  // For a library that opens by path: this file itself, whatever `path` names now.
  std::string path_for_readers() const;

 private:
  explicit ConfinedFile(int fd) : fd_(fd) {}
  // Open without the retry by the path's resolution (for absolute links within a root);
  // `*leads_out`: refused because a link or `..` on the way left the roots.
  static absl::StatusOr<ConfinedFile> OpenAsNamed(const std::string& path,
                                                  const std::vector<std::string>& roots,
                                                  bool* leads_out);
  int fd_ = -1;
};

}  // namespace qlora::coordinator
