// Which files a job may read and where it may write. A job file names datasets, a model folder
// and an output folder, and the coordinator (often root in its image) reads and writes them on
// the job's behalf: without limits any user could train on /etc/shadow or write over another
// service's files. The operator names the folders jobs may read (--read-roots: datasets and
// models) and the one they write to (--output-root); every path of a job is resolved as the file
// system sees it (realpath: symbolic links followed, so a link cannot lead out) and refused with
// INVALID_ARGUMENT naming the field when it leaves them. No roots configured = no confinement
// (the embedded single-user default). Runs at submission, outside the job manager's lock.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/job_config.h"

namespace qlora::coordinator {

// True when `path` is `folder` or lies inside it (both already resolved).
bool IsWithin(const std::string& path, const std::string& folder);

// realpath() of the deepest existing ancestor of `path`, with the rest appended as written.
// Errors name `field`.
absl::StatusOr<std::string> RealPathOfExistingPart(const std::string& path, absl::string_view field);

struct PathRoots {
  std::vector<std::string> read;  // resolved; empty = datasets and models may lie anywhere
  std::vector<std::string> read_as_written;  // the same as the flag wrote them (absolute)
  std::string output;             // resolved; empty = output folders may lie anywhere
};

// The roots from the flags' values (`read` a comma-separated list). Each must be an existing
// folder: INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<PathRoots> ResolvePathRoots(const std::string& read, const std::string& output);

// OK when every dataset file, the model folder and each file in it lie under a read root, and
// the output folder (already resolved, see output_dir_check.h) under the output root.
absl::Status CheckJobPathsConfined(const JobConfig& config, const PathRoots& roots);

// INVALID_ARGUMENT "<subject> <relation> the folders this coordinator reads jobs' files from
// (--read-roots a,b)": the one wording of a path refused by the read roots ("lies outside",
// "leads out of").
absl::Status OutsideReadRoots(absl::string_view subject, absl::string_view relation,
                              const std::vector<std::string>& roots);

// The check made before a path is looked at at all (ParseOptions::before_touching): `path`
// (absolute, lexically normal) must lie in a read root, as written. Links are followed later, by
// CheckJobPathsConfined. OK when there are no read roots.
absl::Status CheckPathWithinReadRoots(absl::string_view field, const std::string& path,
                                      const PathRoots& roots);

}  // namespace qlora::coordinator
