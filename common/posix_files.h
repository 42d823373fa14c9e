// Small POSIX file helpers (join, exists, mkdir -p, read, atomic write). Not std::filesystem: libtorch.so
// exports its own, partly broken, copies of std::filesystem symbols (remove_all calls a null
// pointer), and every worker-side binary links it. Torch-free.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace qlora {

std::string JoinPath(const std::string& dir, const std::string& name);
bool PathExists(const std::string& path);
// mkdir -p.
absl::Status MakeDirs(const std::string& path);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// rm -rf: `path` and everything under it (symbolic links are removed, never followed). OK when
// `path` does not exist.
absl::Status RemoveTree(const std::string& path);
// Writes `path`.tmp, syncs it and renames it over `path` (AtomicFileWriter, atomic_file.h);
// failures name the errno (ENOSPC...) and leave no temporary file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace qlora
