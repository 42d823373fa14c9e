// One job generation's rendezvous: registration, NCCL id relay, Gloo store (see rendezvous.h).
#include "coordinator/jobs/rendezvous.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlora::coordinator {

Rendezvous::Rendezvous(RendezvousOptions options)
    : options_(options), registered_(std::max(options.world_size, 0), false) {}

absl::Status Rendezvous::Register(int rank) {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(registered_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the job's ", registered_.size(), " workers"));
  }
  if (registered_[rank]) {
    // A startup token is single-use: a second Register with it is someone else.
    return absl::PermissionDeniedError(
        absl::StrCat("rank ", rank, " has registered already; a startup token is used once"));
  }
  registered_[rank] = true;
  changed_.SignalAll();
  return absl::OkStatus();
}

bool Rendezvous::AllRegistered() const {
  absl::MutexLock lock(&mu_);
  return std::all_of(registered_.begin(), registered_.end(), [](bool r) { return r; });
}

std::string Rendezvous::UnregisteredRanks() const {
  absl::MutexLock lock(&mu_);
  return UnregisteredRanksLocked();
}

std::string Rendezvous::UnregisteredRanksLocked() const {
  std::vector<std::string> missing;
  for (size_t rank = 0; rank < registered_.size(); ++rank) {
    if (!registered_[rank]) missing.push_back(std::to_string(rank));
  }
  return absl::StrJoin(missing, ", ");
}

absl::Status Rendezvous::PublishNcclId(int rank, std::string id) {
  if (rank != 0) return absl::PermissionDeniedError("only rank 0 publishes the NCCL id");
  absl::MutexLock lock(&mu_);
  nccl_unique_id_ = std::move(id);
  changed_.SignalAll();
  return absl::OkStatus();
}

bool Rendezvous::PeersReady(int rank) const {
  if (!std::all_of(registered_.begin(), registered_.end(), [](bool r) { return r; })) return false;
  return !options_.relay_nccl_id || rank == 0 || !nccl_unique_id_.empty();
}

absl::StatusOr<std::string> Rendezvous::AwaitPeers(int rank, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!closed_ && !PeersReady(rank)) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (closed_) return absl::AbortedError(close_reason_);
  if (!PeersReady(rank)) {
    const std::string missing = UnregisteredRanksLocked();
    return absl::DeadlineExceededError(missing.empty() ? "rank 0 has not published the NCCL id"
                                                       : absl::StrCat("waiting for rank(s) ", missing));
  }
  return nccl_unique_id_;
}

absl::Status Rendezvous::CheckGeneration(int64_t generation) const {
  if (generation == options_.generation) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("stale rendezvous generation ", generation,
                                                    " (the job's is ", options_.generation, ")"));
}

absl::Status Rendezvous::Set(int64_t generation, const std::string& key, std::string value) {
  if (absl::Status s = CheckGeneration(generation); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  kv_[key] = std::move(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Rendezvous::Get(int64_t generation, const std::string& key,
                                            absl::Time deadline) {
  if (absl::Status s = CheckGeneration(generation); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  while (!closed_ && kv_.count(key) == 0) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  auto it = kv_.find(key);
  if (it != kv_.end()) return it->second;
  if (closed_) return absl::AbortedError(close_reason_);
  return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", key, "' was not set in time"));
}

void Rendezvous::Close(std::string reason) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  closed_ = true;
  close_reason_ = std::move(reason);
  changed_.SignalAll();
}

}  // namespace qlora::coordinator
