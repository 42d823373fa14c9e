// Shared helpers of the config tests: parsing without touching the file system, fixture paths
// (files are read with tests/util/files.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/config/job_config_parser.h"
#include "tests/util/files.h"

namespace qlora::testing {

// The fixture folder (tests/assets/jobs), compiled in: parameterized tests list the fixtures
// while ctest discovers them, before any test environment exists.
inline std::string JobFixturesDir() { return QLORA_JOB_FIXTURES_DIR; }

// Parses `yaml` with paths unchecked and a dataset given as on the command line.
inline absl::StatusOr<JobConfig> ParseNoPaths(const std::string& yaml,
                                              const std::string& source = "job.yaml") {
  ParseOptions options;
  options.source_name = source;
  options.check_paths = false;
  options.dataset_override = "train.jsonl";
  return ParseJobConfig(yaml, options);
}

// The original Ludwig job file of the feature, verbatim.
inline constexpr char kLudwigOriginal[] = R"(model_type: llm
base_model: meta-llama/Llama-2-7b-hf
input_features: [{name: instruction, type: text}]
output_features: [{name: output, type: text}]
adapter: {type: lora}
quantization: {bits: 4}
backend:
  type: ray
  trainer:
    use_gpu: true
    strategy: {type: deepspeed, zero_optimization: {stage: 2}}
trainer: {type: finetune, batch_size: 1, gradient_accumulation_steps: 4}
)";

}  // namespace qlora::testing
