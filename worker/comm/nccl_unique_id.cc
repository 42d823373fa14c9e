// ncclGetUniqueId wrapper (see nccl_unique_id.h).
#include "worker/comm/nccl_unique_id.h"

#include "absl/strings/str_cat.h"

#ifdef QLORA_HAVE_NCCL
#include <nccl.h>
#endif

namespace qlora::comm {

absl::StatusOr<std::string> MakeNcclUniqueId() {
#ifdef QLORA_HAVE_NCCL
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("nccl: ncclGetUniqueId failed: ", ncclGetErrorString(result)));
  }
  return std::string(id.internal, sizeof(id.internal));
#else
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

}  // namespace qlora::comm
