// ncclGetUniqueId wrapper (see nccl_id.h).
#include "worker/service/nccl_id.h"

#include "absl/strings/str_cat.h"

#ifdef QLORA_HAVE_NCCL
#include <nccl.h>
#endif

namespace qlora::worker {

absl::StatusOr<std::string> MakeNcclUniqueId() {
#ifdef QLORA_HAVE_NCCL
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  return std::string(id.internal, sizeof(id.internal));
#else
  return absl::UnimplementedError("this worker was built without NCCL");
#endif
}

}  // namespace qlora::worker
