// The Gloo rendezvous store of one job generation, served by the coordinator over gRPC.
#pragma once

#include "worker/comm/rendezvous_store.h"
#include "worker/service/coordinator_client.h"

namespace qlora::worker {

class GrpcRendezvousStore : public comm::RendezvousStore {
 public:
  GrpcRendezvousStore(CoordinatorClient* client, int64_t generation)
      : client_(client), generation_(generation) {}

  absl::Status Set(const std::string& key, const std::string& bytes) override {
    return client_->StoreSet(generation_, key, bytes);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return client_->StoreGet(generation_, key, timeout);
  }

 private:
  CoordinatorClient* const client_;
  const int64_t generation_;
};

}  // namespace qlora::worker
