// What a generation session asks of a worker and what it hands back, torch-free so that the
// worker's gRPC side (which must not see torch's bundled protobuf headers) can drive it. The
// run itself: generation_run.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"

namespace qlora::worker {

struct GenerationRequest {
  JobConfig job;                       // resolved
  std::string adapter_dir;
  std::vector<std::string> prompts;
  GenerationConfig parameters;         // the request's settings (unset: the job's, ...)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;       // the output ends before the first of these
};

struct GeneratedPiece {
  int prompt_index = 0;
  std::string text;
  bool done = false;
  std::string finish_reason;           // with done: eos, length, stop, context
  int64_t prompt_tokens = 0;           // with done
  int64_t generated_tokens = 0;        // with done
};

// Returns whether to go on (false: the client went away).
using PieceSink = std::function<absl::StatusOr<bool>(const GeneratedPiece&)>;

// Runs every prompt of `request` on `device` ("cuda" or "cpu"), in order (generation_run.cc).
absl::Status RunGeneration(const GenerationRequest& request, const std::string& device,
                           const PieceSink& emit);

}  // namespace qlora::worker
