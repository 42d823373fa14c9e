// Confines the worker process's file accesses with Linux Landlock, so that the coordinator's
// roots hold at the moment of use: a dataset or model file swapped for a link after submit, or an
// output folder swapped for a link to another place, is refused by the kernel when it is opened
// (EACCES), whatever path leads there. Rules attach to the folders' inodes when they are made,
// so a later rename or link cannot move them.
//
// Allowed: reading beneath `read_beneath` (the read roots) and the system's own folders (the
// loaded libraries' folders, /usr, /lib*, /proc, /sys, /dev, the few /etc files name resolution
// and TLS read); reading and writing beneath `write_beneath` (the job's output folder) and /dev
// (GPU devices, NCCL's shared memory); writing its own threads' files under /proc/<pid>/task
// (the CUDA driver names its threads there and cannot start without). With no `read_beneath`,
// reads are not confined (the coordinator has no read roots), only writes.
//
// Must run before the process starts any thread: Landlock restricts the calling thread and what
// it creates later. Irreversible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace qlora::worker {

struct FileConfinement {
  std::vector<std::string> read_beneath;
  std::vector<std::string> write_beneath;
};

// UNIMPLEMENTED when the kernel has no Landlock (the caller decides whether to go on); other
// errors name the folder or call that failed.
absl::Status ConfineFiles(const FileConfinement& confinement);

}  // namespace qlora::worker
