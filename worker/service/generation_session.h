// `qlora-worker --generate=SESSION`: one generation session from task to last piece (the
// coordinator's Generate RPC started this process and relays what it reports).
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "worker/run/generation_request.h"

namespace qlora::worker {

// Exit status as the worker's: 0 done (or the client went away), 1 failed (reported), 3 the
// coordinator is unreachable.
// `run` generates (RunGeneration: injected, as this side never links torch).
using GenerationRunner = std::function<absl::Status(const GenerationRequest&, const std::string& device,
                                                    const PieceSink&)>;
int RunGenerationSession(const std::string& coordinator_address, const std::string& session_id,
                         const std::string& startup_token, const std::string& device,
                         const std::atomic<bool>& stop_requested, const GenerationRunner& run);

}  // namespace qlora::worker
