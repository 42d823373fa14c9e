// Store marks that tell which ranks reached a point, so that a rendezvous or a collective that
// times out can name the rank that is missing instead of only saying "timeout" (design
// principle 6). Used by every Communicator backend; torch-free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/comm/rendezvous_store.h"

namespace qlora::comm {

// "rank 3" or "ranks 1, 3".
std::string DescribeRanks(const std::vector<int>& ranks);

// Not thread-safe: one per communicator, used by the thread that runs its collectives.
class LivenessBoard {
 public:
  // `prefix` namespaces the marks: job and rendezvous generation.
  LivenessBoard(std::shared_ptr<RendezvousStore> store, std::string prefix, int rank,
                int world_size);

  // Marks this rank as joined and waits until every rank has. DEADLINE_EXCEEDED names the ranks
  // that did not join within `timeout`; store errors pass through.
  absl::Status Join(absl::Duration timeout);

  // Called after the operation named `point` (unique per collective, e.g. "op/17") failed here:
  // marks this rank as having been in it and returns the ranks whose mark did not appear within
  // `grace` - they never entered it, or died. Empty when all were there (or the store failed).
  std::vector<int> RanksAbsentFrom(const std::string& point, absl::Duration grace);

  RendezvousStore& store() { return *store_; }
  const std::string& prefix() const { return prefix_; }

 private:
  // Sets this rank's mark under `point` and waits up to `timeout` for every rank's mark.
  absl::StatusOr<std::vector<int>> Absent(const std::string& point, absl::Duration timeout);

  std::shared_ptr<RendezvousStore> store_;
  std::string prefix_;
  int rank_;
  int world_size_;
};

}  // namespace qlora::comm
