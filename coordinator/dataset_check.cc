// stat-only checks of a job's dataset files (see dataset_check.h).
#include "coordinator/dataset_check.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace qlora::coordinator {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status CheckFile(const char* field, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {  // follows links: what a reader would open
    const int err = errno;
    const std::string message = absl::StrCat(field, ": cannot stat '", path, "': ", strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is ", KindOf(st.st_mode), ", not a regular file"));
  }
  if (st.st_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is empty"));
  }
  return absl::OkStatus();
}

// `paths` is split as the shard planner splits it (shard_plan.cc).
absl::Status CheckList(const char* field, const std::string& paths) {
  const std::vector<std::string> files = absl::StrSplit(paths, ',', absl::SkipEmpty());
  for (const std::string& file : files) QLORA_RETURN_IF_ERROR(CheckFile(field, file));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDatasetFiles(const DataConfig& data) {
  QLORA_RETURN_IF_ERROR(CheckList("dataset", data.train_path));
  return CheckList("validation_dataset", data.validation_path);
}

}  // namespace qlora::coordinator
