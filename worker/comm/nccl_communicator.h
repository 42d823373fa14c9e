// Communicator over NCCL for CUDA tensors (built only with CUDA: QLORA_HAVE_NCCL). Rank 0 makes
// the unique id (MakeNcclUniqueId) and the coordinator relays it to every rank in NcclOptions.
// Initialisation is non-blocking and polled against a deadline, so a rank that never joins gives
// DEADLINE_EXCEEDED instead of a hang; collectives run on the current CUDA stream and are waited
// for by polling, with ncclCommAbort past the deadline (the nccl-tests pattern).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl_unique_id.h"  // MakeNcclUniqueId
#include "worker/comm/rendezvous_store.h"

namespace qlora::comm {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;         // CUDA device ordinal this rank uses
  std::string unique_id;  // NCCL_UNIQUE_ID_BYTES bytes from rank 0's MakeNcclUniqueId()
  absl::Duration init_timeout = absl::Seconds(60);
  // Optional: with a store, a rank missing from the join or from a timed-out collective is named
  // (marks under `prefix`, as in the Gloo backend); without one, timeouts cannot name it.
  std::shared_ptr<RendezvousStore> store;
  std::string prefix;
  absl::Duration liveness_grace = absl::Seconds(2);
};


absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(const NcclOptions& options);

}  // namespace qlora::comm
