// A start's file-system work, done outside the job manager's lock (see start_prep.h).
#include "coordinator/start_prep.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace qlora::coordinator {
namespace {

absl::Status EnsureDir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobShards> PrepareStart(const StartRequest& request) {
  QLORA_ASSIGN_OR_RETURN(JobShards shards, PlanJobShards(request.data, request.world_size));
  QLORA_RETURN_IF_ERROR(EnsureDir(request.log_dir));
  QLORA_RETURN_IF_ERROR(EnsureDir(request.output_dir));
  return shards;
}

}  // namespace qlora::coordinator
