// Rank 0 of a GPU job makes the NCCL unique id that the coordinator relays to the other ranks.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace qlora::worker {

// The bytes of a fresh ncclUniqueId; UNIMPLEMENTED in builds without NCCL.
absl::StatusOr<std::string> MakeNcclUniqueId();

}  // namespace qlora::worker
