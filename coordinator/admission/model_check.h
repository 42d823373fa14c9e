// The submission-time check of a job's base model: its config.json must describe a model the
// workers can train (a supported model_type and a config they accept), so a GPT-2 or Gemma
// folder is refused at Submit and Validate instead of failing every worker after the queue.
// Runs outside the job manager's lock, after path confinement: config.json is stat'ed first
// (a regular file of at most 4 MiB, so a FIFO or a device never blocks the call) and only then
// read.
#pragma once

#include <string>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/config/job_config.h"

namespace qlora::coordinator {

// OK, or INVALID_ARGUMENT "base_model '<dir>': config.json: ..." naming what the engine refuses
// (e.g. model_type "gpt2" is not supported (supported: llama, mistral, qwen2)). An empty
// `model_dir` (nothing resolved locally) is OK.
// With `lora`, also INVALID_ARGUMENT "adapter.r: ..." when the rank exceeds what an adapter of a
// targeted projection can have (min(in, out) of the smallest): such a job would only fail in its
// workers (a rank of 1e9 asks for terabytes), so it is refused before it is queued.
// With `roots` (the read roots), config.json is opened beneath them (admission/confined_open.h).
absl::Status CheckBaseModelConfig(const std::string& model_dir, const LoraConfig* lora = nullptr,
                                  const std::vector<std::string>& roots = {});

}  // namespace qlora::coordinator
