// Sums a few doubles over every rank of a communicator (losses, token counts, per-rank counts).
// Collective (with one rank, the values themselves: no device work). Torch side.
#pragma once

#include <vector>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"

namespace qlora::worker {

// `device` is where the communicator reduces (CUDA for NCCL, CPU for Gloo).
absl::StatusOr<std::vector<double>> SumOverRanks(comm::Communicator& comm,
                                                 const std::vector<double>& values,
                                                 const at::Device& device);

}  // namespace qlora::worker
