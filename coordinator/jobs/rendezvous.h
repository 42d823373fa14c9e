// The rendezvous of one job generation: which ranks have registered, the NCCL unique id that
// rank 0 publishes and the other ranks receive, and the key/value store that Gloo's rendezvous
// runs on. A new start of a job (a new generation) gets a new Rendezvous; a store request naming
// another generation is refused, so a worker of an earlier start can neither read nor overwrite
// this one's keys. Every wait has a deadline and names what is missing when it expires; Close()
// ends the waits at once (the job ended, or the coordinator stops). No gRPC here.
//
// Thread-safe. The blocking calls (AwaitPeers, Get) wait on this object's own lock only; callers
// must not hold a lock that another thread needs in order to call Register, PublishNcclId, Set
// or Close (JobManager releases its lock before it waits here).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace qlora::coordinator {

struct RendezvousOptions {
  int64_t generation = 0;            // store keys and the NCCL id belong to this generation
  int world_size = 1;
  bool relay_nccl_id = false;        // GPU jobs: ranks > 0 wait for rank 0's NCCL unique id
};

class Rendezvous {
 public:
  explicit Rendezvous(RendezvousOptions options);
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int64_t generation() const { return options_.generation; }
  int world_size() const { return options_.world_size; }

  // Marks `rank` registered (again: no change). INVALID_ARGUMENT for a rank outside the world.
  absl::Status Register(int rank);
  bool AllRegistered() const;
  // "1, 3": the ranks that have not registered ("" when all have).
  std::string UnregisteredRanks() const;

  // Rank 0 publishes the NCCL unique id (PERMISSION_DENIED for any other rank).
  absl::Status PublishNcclId(int rank, std::string id);
  // Blocks until every rank has registered and, when the id is relayed and `rank` is not 0,
  // rank 0 has published it; returns the id ("" when it is not relayed). ABORTED once closed;
  // DEADLINE_EXCEEDED naming the unregistered ranks (or the missing id) at `deadline`.
  absl::StatusOr<std::string> AwaitPeers(int rank, absl::Time deadline);

  // Gloo's key/value store. FAILED_PRECONDITION when `generation` is not this one.
  absl::Status Set(int64_t generation, const std::string& key, std::string value);
  // Blocks until `key` is set; DEADLINE_EXCEEDED naming the key at `deadline`; ABORTED when
  // closed before the key was set (a key already set is still returned after Close).
  absl::StatusOr<std::string> Get(int64_t generation, const std::string& key, absl::Time deadline);

  // Ends every wait, now and later, with ABORTED(`reason`). Idempotent: the first reason stays.
  void Close(std::string reason);

 private:
  absl::Status CheckGeneration(int64_t generation) const;
  bool PeersReady(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string UnregisteredRanksLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RendezvousOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;            // a registration, the NCCL id, a key, Close
  std::vector<bool> registered_ ABSL_GUARDED_BY(mu_);
  std::string nccl_unique_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string close_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qlora::coordinator
