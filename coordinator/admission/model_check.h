// The submission-time check of a job's base model: its config.json must describe a model the
// workers can train (a supported model_type and a config they accept), so a GPT-2 or Gemma
// folder is refused at Submit and Validate instead of failing every worker after the queue.
// Runs outside the job manager's lock, after path confinement: config.json is stat'ed first
// (a regular file of at most 4 MiB, so a FIFO or a device never blocks the call) and only then
// read.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace qlora::coordinator {

// OK, or INVALID_ARGUMENT "base_model '<dir>': config.json: ..." naming what the engine refuses
// (e.g. model_type "gpt2" is not supported (supported: llama, mistral, qwen2)). An empty
// `model_dir` (nothing resolved locally) is OK.
absl::Status CheckBaseModelConfig(const std::string& model_dir);

}  // namespace qlora::coordinator
