// The generation worker's side of WorkerService: fetch the session's task, report each piece
// of text (the reply says whether the client still listens) or the failure. Every call carries
// the session id and the startup token.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "qlora/v1/worker_service.pb.h"

namespace qlora::worker {

class GenerationClient {
 public:
  static absl::StatusOr<std::unique_ptr<GenerationClient>> Connect(const std::string& coordinator_address,
                                                                   const std::string& session_id,
                                                                   const std::string& startup_token);
  virtual ~GenerationClient() = default;
  virtual absl::StatusOr<v1::GenerationTask> Task() = 0;
  // False: the client went away (stop generating).
  virtual absl::StatusOr<bool> Report(const v1::GeneratedText& piece) = 0;
  virtual absl::Status ReportFailure(const absl::Status& failure) = 0;
};

}  // namespace qlora::worker
