// Rank 0 of a GPU job makes the NCCL unique id that the coordinator relays to the other ranks.
// Torch-free, so the worker's gRPC side can call it before the engine starts.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace qlora::comm {

// The bytes of a fresh ncclUniqueId (rank 0 only); UNIMPLEMENTED in builds without NCCL.
absl::StatusOr<std::string> MakeNcclUniqueId();

}  // namespace qlora::comm
