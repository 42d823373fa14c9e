// The one wording of a failed collective, for every communicator backend: which collective (by
// name and sequence number), what it carried, whether it failed or ran out of time, which ranks
// never entered it (as the LivenessBoard saw), and the library's own words. A timeout is
// DEADLINE_EXCEEDED, any other failure UNAVAILABLE.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace qlora::comm {

struct CollectiveFailure {
  std::string where;                      // e.g. "gloo all_reduce (rank 1 of 4)"
  uint64_t sequence = 0;                  // the communicator's collective count
  at::Tensor tensor;                      // what it carried; undefined for a barrier
  bool timed_out = false;
  absl::Duration timeout;
  std::optional<std::vector<int>> absent; // nullopt: no store could tell who was missing
  std::string detail;                     // the library's message, e.g. "gloo: Timed out ..."
};

absl::Status CollectiveFailureStatus(const CollectiveFailure& failure);

}  // namespace qlora::comm
