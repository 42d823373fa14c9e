// stat checks of a job's dataset files, and the footer of Parquet ones (see dataset_check.h).
#include "coordinator/admission/dataset_check.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/dataset/arrow_ipc_reader.h"
#include "common/dataset/parquet_reader.h"
#include "common/dataset/record.h"
#include "common/status_macros.h"
#include "coordinator/admission/confined_open.h"

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

absl::Status CheckFile(const char* field, const std::string& path, DatasetFormat format,
                       const std::vector<std::string>& roots) {
  // Opened O_PATH beneath the roots (links followed within them only); what is read below is
  // this very file, whatever the path names by then.
  absl::StatusOr<ConfinedFile> file = ConfinedFile::Open(path, roots);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(field, ": cannot stat '", path, "': ", file.status().message()));
  }
  struct stat st;
  if (fstat(file->fd(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot stat '", path, "': ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is ", KindOf(st.st_mode), ", not a regular file"));
  }
  if (st.st_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is empty"));
  }
  // Parquet: the footer, so that a truncated or corrupt file fails here rather than on every
  // worker. (A name of no known format is left to the planner's message.)
  absl::StatusOr<data::DataFormat> resolved = data::ResolveFormat(format, path);
  if (resolved.ok() && *resolved == data::DataFormat::kParquet) {
    absl::StatusOr<data::ParquetLayout> layout = data::ReadParquetLayout(file->path_for_readers());
    if (!layout.ok()) {  // the message names the file as the job does
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ",
          absl::StrReplaceAll(layout.status().message(), {{file->path_for_readers(), path}})));
    }
    if (layout->rows == 0)
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' has no rows"));
  }
  if (resolved.ok() && *resolved == data::DataFormat::kArrow) {
    absl::StatusOr<data::ArrowLayout> layout = data::ReadArrowLayout(file->path_for_readers());
    if (!layout.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ",
          absl::StrReplaceAll(layout.status().message(), {{file->path_for_readers(), path}})));
    }
    if (layout->rows == 0)
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' has no rows"));
  }
  return absl::OkStatus();
}

// `paths` is split as the shard planner splits it (shard_plan.cc).
absl::Status CheckList(const char* field, const std::string& paths, DatasetFormat format,
                       const std::vector<std::string>& roots) {
  const std::vector<std::string> files = absl::StrSplit(paths, ',', absl::SkipEmpty());
  for (const std::string& file : files) QLORA_RETURN_IF_ERROR(CheckFile(field, file, format, roots));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDatasetFiles(const DataConfig& data, const std::vector<std::string>& roots) {
  QLORA_RETURN_IF_ERROR(CheckList("dataset", data.train_path, data.format, roots));
  return CheckList("validation_dataset", data.validation_path, data.format, roots);
}

}  // namespace qlora::coordinator
