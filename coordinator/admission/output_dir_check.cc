// Output-folder checks at submission (see output_dir_check.h).
#include "coordinator/admission/output_dir_check.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/status_macros.h"
#include "coordinator/admission/path_confinement.h"

namespace qlora::coordinator {
namespace {

absl::Status Refuse(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("output_dir: ", path, " ", why));
}

bool IsNonEmptyFolder(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return false;
  bool empty = true;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  ::closedir(d);
  return !empty;
}

}  // namespace

absl::StatusOr<std::string> ResolveOutputDir(const std::string& output_dir,
                                             const std::string& state_dir) {
  QLORA_ASSIGN_OR_RETURN(std::string resolved, RealPathOfExistingPart(output_dir, "output_dir"));
  QLORA_ASSIGN_OR_RETURN(std::string state, RealPathOfExistingPart(state_dir, "state folder"));
  if (IsWithin(resolved, state) || IsWithin(state, resolved)) {
    return Refuse(output_dir, absl::StrCat("is the coordinator's state folder (", state,
                                           ") or overlaps it; choose a folder of your own"));
  }
  struct stat st {};
  if (::lstat(resolved.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return Refuse(output_dir, "exists and is not a folder");
    if (IsNonEmptyFolder(resolved)) {
      return Refuse(output_dir, "exists and is not empty; a job writes into a folder of its own");
    }
  }
  return resolved;
}

absl::Status CheckOutputDirIsFree(const std::string& resolved, const std::vector<std::string>& taken) {
  for (const std::string& other : taken) {
    if (IsWithin(resolved, other) || IsWithin(other, resolved)) {
      return Refuse(resolved, absl::StrCat("overlaps the output folder of another job (", other, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace qlora::coordinator
