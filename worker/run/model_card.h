// The adapter folder's README.md: a model card like the one peft's save_pretrained writes (YAML
// front matter with base_model, library_name: peft, pipeline_tag and tags), then what was trained
// on what, with which settings, and how it ended (TrainSummary). Torch-free.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/config/job_config.h"
#include "common/worker_protocol.h"

namespace qlora::worker {

inline constexpr char kModelCardFile[] = "README.md";

struct ModelCardOptions {
  const JobConfig* config = nullptr;  // required
  int world_size = 1;                 // data-parallel ranks
  TrainSummary summary;
};

// The card's Markdown. Dataset files appear by file name only (not the host's folders).
std::string RenderModelCard(const ModelCardOptions& options);

// Writes RenderModelCard into `adapter_dir`/README.md.
absl::Status WriteModelCard(const std::string& adapter_dir, const ModelCardOptions& options);

}  // namespace qlora::worker
