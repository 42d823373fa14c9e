// The worker's side of WorkerService: one authenticated channel to the coordinator (job id +
// startup token), every call with a deadline, results as plain structs.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/worker_protocol.h"

namespace qlora::worker {

struct WorkerIdentity {
  std::string coordinator_address;   // host:port
  std::string job_id;
  std::string startup_token;
  int rank = 0;
};

class CoordinatorClient {
 public:
  // A client dialling the coordinator in plaintext or TLS, as the environment says
  // (common/rpc/coordinator_channel.h); INVALID_ARGUMENT when a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(const WorkerIdentity& identity);
  virtual ~CoordinatorClient() = default;

  // Introduces this worker (its rank and pid); the assignment says what it runs and where.
  virtual absl::Status Register() = 0;
  // Blocks until every rank registered (and the NCCL id is known), at most `timeout`.
  virtual absl::StatusOr<WorkerAssignment> GetAssignment(absl::Duration timeout) = 0;
  virtual absl::Status PublishNcclId(const std::string& id) = 0;
  // True when the job was cancelled or failed elsewhere: stop now.
  virtual absl::StatusOr<bool> Heartbeat() = 0;
  virtual absl::Status ReportProgress(const ProgressSnapshot& progress) = 0;
  virtual absl::Status ReportCompletion(const WorkerCompletion& completion) = 0;
  virtual absl::Status StoreSet(int64_t generation, const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> StoreGet(int64_t generation, const std::string& key,
                                               absl::Duration timeout) = 0;
};

}  // namespace qlora::worker
