// A job's output folder must be its own. A job file may name any output_dir; the coordinator
// (which may run as root) then writes adapters, checkpoints and merged models there. So at
// submission the path is resolved as the file system will see it (symbolic links followed, up to
// the deepest folder that exists) and refused with INVALID_ARGUMENT naming output_dir when it
//   - lies inside the coordinator's state folder (its database, every job's logs and outputs),
//   - is, holds or lies inside the output folder of another job, or
//   - is a folder that exists and is not empty (someone else's files, or another job's).
// The file-system part (ResolveOutputDir) runs outside the job manager's lock; the comparison
// with the other jobs (CheckOutputDirIsFree) is pure string work, done under it, so two jobs
// submitted at once cannot both take one folder.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace qlora::coordinator {

// `output_dir` (absolute) with every symbolic link of its existing part resolved. Refuses the
// state folder and a non-empty existing folder.
absl::StatusOr<std::string> ResolveOutputDir(const std::string& output_dir,
                                             const std::string& state_dir);

// OK unless `resolved` is, holds or lies inside one of `taken` (resolved output folders).
absl::Status CheckOutputDirIsFree(const std::string& resolved, const std::vector<std::string>& taken);

}  // namespace qlora::coordinator
