// Communicator over Gloo (Debian's libgloo, TCP transport) for CPU tensors. Rendezvous goes
// through a RendezvousStore (served by the coordinator in production); a store-based join check
// names ranks that never arrive, and a store-based liveness check names the rank missing from a
// collective that times out.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_store.h"

namespace qlora::comm {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Namespace of this rendezvous in the store: job id and restart generation, e.g.
  // "job-42/gen-3". Every (re)start of a job must use a new one.
  std::string prefix;
  // Address this rank listens on for its peers (the host's own address when ranks run on
  // several hosts), or, when `iface` is set, the address of that network interface.
  std::string hostname = "127.0.0.1";
  std::string iface;
  // How long to wait for every rank to join and connect.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Part of a collective's timeout kept back to ask the store which ranks were missing when it
  // times out: min(timeout / 4, liveness_grace).
  absl::Duration liveness_grace = absl::Seconds(2);
};

// Joins the rendezvous and connects a full mesh. DEADLINE_EXCEEDED names the ranks that did not
// join within connect_timeout.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    const GlooOptions& options, std::shared_ptr<RendezvousStore> store);

}  // namespace qlora::comm
