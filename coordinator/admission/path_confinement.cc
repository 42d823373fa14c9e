// Confinement of a job's paths to the operator's folders (see path_confinement.h).
#include "coordinator/admission/path_confinement.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace qlora::coordinator {
namespace {

absl::StatusOr<std::string> RealPath(const std::string& path, absl::string_view field) {
  char buffer[PATH_MAX];
  if (::realpath(path.c_str(), buffer) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": ", std::strerror(errno)));
  }
  return std::string(buffer);
}

bool WithinAny(const std::string& path, const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    if (IsWithin(path, root)) return true;
  }
  return false;
}

absl::Status CheckReadable(const std::string& path, absl::string_view field, const PathRoots& roots) {
  QLORA_ASSIGN_OR_RETURN(std::string real, RealPath(path, field));
  if (WithinAny(real, roots.read)) return absl::OkStatus();
  return OutsideReadRoots(
      absl::StrCat(field, ": ", path, real == path ? "" : absl::StrCat(" (", real, ")")),
      "lies outside", roots.read);
}

// A model or adapter folder and every entry in it (a file in the folder may be a link leading
// out).
absl::Status CheckFolder(const std::string& folder, const char* field, const PathRoots& roots) {
  QLORA_RETURN_IF_ERROR(CheckReadable(folder, field, roots));
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return absl::OkStatus();  // the loader reports an unreadable folder
  absl::Status status;
  while (const dirent* entry = ::readdir(dir)) {
    if (std::strcmp(entry->d_name, ".") == 0 || std::strcmp(entry->d_name, "..") == 0) continue;
    status = CheckReadable(absl::StrCat(folder, "/", entry->d_name), field, roots);
    if (!status.ok()) break;
  }
  ::closedir(dir);
  return status;
}

}  // namespace

bool IsWithin(const std::string& path, const std::string& folder) {
  return path == folder || absl::StartsWith(path, folder == "/" ? "/" : folder + "/");
}

absl::StatusOr<std::string> RealPathOfExistingPart(const std::string& path, absl::string_view field) {
  std::string head = path, tail;
  while (true) {
    char buffer[PATH_MAX];
    if (::realpath(head.c_str(), buffer) != nullptr) {
      std::string real = buffer;
      if (!tail.empty()) real = real == "/" ? "/" + tail : real + "/" + tail;
      return real;
    }
    if (errno != ENOENT && errno != ENOTDIR) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": ", std::strerror(errno)));
    }
    const size_t slash = head.find_last_of('/');
    if (slash == std::string::npos || head == "/") {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " is not an absolute path"));
    }
    tail = tail.empty() ? head.substr(slash + 1) : head.substr(slash + 1) + "/" + tail;
    head = slash == 0 ? "/" : head.substr(0, slash);
  }
}

absl::StatusOr<PathRoots> ResolvePathRoots(const std::string& read, const std::string& output) {
  PathRoots roots;
  auto folder = [](const std::string& path, absl::string_view flag) -> absl::StatusOr<std::string> {
    QLORA_ASSIGN_OR_RETURN(std::string real, RealPath(path, flag));
    struct stat st {};
    if (::stat(real.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a folder"));
    }
    return real;
  };
  for (absl::string_view part : absl::StrSplit(read, ',', absl::SkipEmpty())) {
    QLORA_ASSIGN_OR_RETURN(std::string real, folder(std::string(part), "--read-roots"));
    roots.read.push_back(std::move(real));
    std::error_code ec;
    std::string written = std::filesystem::absolute(std::string(part), ec).lexically_normal();
    if (written.size() > 1 && written.back() == '/') written.pop_back();  // "/data/" as "/data"
    roots.read_as_written.push_back(std::move(written));
  }
  if (!output.empty()) {
    QLORA_ASSIGN_OR_RETURN(roots.output, folder(output, "--output-root"));
  }
  return roots;
}

absl::Status CheckPathWithinReadRoots(absl::string_view field, const std::string& path,
                                      const PathRoots& roots) {
  // As written or resolved: a root reached through a link is still the root.
  if (roots.read.empty() || WithinAny(path, roots.read) || WithinAny(path, roots.read_as_written)) {
    return absl::OkStatus();
  }
  return OutsideReadRoots(absl::StrCat(field, ": ", path), "lies outside", roots.read);
}

absl::Status OutsideReadRoots(absl::string_view subject, absl::string_view relation,
                              const std::vector<std::string>& roots) {
  return absl::InvalidArgumentError(
      absl::StrCat(subject, " ", relation, " the folders this coordinator reads jobs' files from "
                   "(--read-roots ", absl::StrJoin(roots, ","), ")"));
}

absl::Status CheckJobPathsConfined(const JobConfig& config, const PathRoots& roots) {
  if (!roots.read.empty()) {
    for (const auto& [field, list] : {std::pair<const char*, const std::string&>{"dataset", config.data.train_path},
                                      {"validation_dataset", config.data.validation_path}}) {
      for (absl::string_view file : absl::StrSplit(list, ',', absl::SkipEmpty())) {
        QLORA_RETURN_IF_ERROR(CheckReadable(std::string(file), field, roots));
      }
    }
    if (!config.base_model_path.empty()) {
      QLORA_RETURN_IF_ERROR(CheckFolder(config.base_model_path, "base_model", roots));
    }
    if (!config.lora.pretrained_adapter_path.empty()) {
      QLORA_RETURN_IF_ERROR(CheckFolder(config.lora.pretrained_adapter_path,
                                        "adapter.pretrained_adapter_weights", roots));
    }
    if (!config.trainer.resume_from_checkpoint.empty()) {
      QLORA_RETURN_IF_ERROR(CheckFolder(config.trainer.resume_from_checkpoint,
                                        "trainer.resume_from_checkpoint", roots));
    }
  }
  if (!roots.output.empty() && !config.output_dir.empty() && !IsWithin(config.output_dir, roots.output)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output_dir: ", config.output_dir, " lies outside the folder this coordinator writes jobs' outputs to "
        "(--output-root ", roots.output, "); leave output_dir out to use the coordinator's own"));
  }
  return absl::OkStatus();
}

}  // namespace qlora::coordinator
