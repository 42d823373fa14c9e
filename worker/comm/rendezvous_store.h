// The key/value store that ranks of one job rendezvous through (Gloo addresses, liveness marks).
// The coordinator serves it over gRPC in production; InMemoryRendezvousStore serves ranks that are
// threads of one process. Keys are plain strings; callers namespace them per job and generation.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace qlora::comm {

// Implementations must be thread-safe: every method may be called from several threads at once.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Stores `bytes` under `key`, replacing any earlier value.
  virtual absl::Status Set(const std::string& key, const std::string& bytes) = 0;

  // Returns the value of `key`, waiting up to `timeout` for it to appear; DEADLINE_EXCEEDED when
  // it does not. A zero timeout checks without waiting.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

}  // namespace qlora::comm
