// Ludwig's LLM sections that map onto this service's own keys (internal to qlora_config):
//
//   prompt: {template: "...{column}..."}          -> data.prompt_template
//   preprocessing:
//     split: {type: random, probabilities: [train, validation, test]}
//                                                  -> data.validation_fraction, data.test_fraction
//     global_max_sequence_length: N               -> data.max_sequence_length
//   generation: {temperature, max_new_tokens, ...} -> JobConfig::generation (kept with the job
//                                                     for inference; training does not read it)
//
// A value given both ways must agree; when it does not, INVALID_ARGUMENT names both keys and
// their lines. Unknown keys inside these sections get the schema's did-you-mean errors.
#pragma once

#include "absl/status/status.h"
#include "common/config/job_config.h"
#include "common/config/yaml_map_reader.h"

namespace qlora::config_internal {

// The longest row a job may ask for (data.max_sequence_length, Ludwig's
// global_max_sequence_length): 2^20 tokens, beyond what one GPU trains (the memory planner
// tiles and offloads past a few hundred thousand) but no cap on what it might.
inline constexpr int kMaxSequenceLength = 1 << 20;

// Reads `prompt` and `preprocessing` of the top-level mapping into *d, after the `data` section
// was read into it. Sets *split_written when preprocessing.split set the split fractions.
absl::Status ReadLudwigDataSections(const MapReader& top, DataConfig* d, bool* split_written);

// Reads `output` (gguf: true | false | f16 | bf16 | q8_0 | f32) into c->gguf_type; a GGUF
// implies the merged model it is made from.
absl::Status ReadOutput(const MapReader& top, JobConfig* c);

// Reads `generation` into *g (only the keys written are set). A `new_file` (not a stored
// resolved copy) is also refused sampling at temperature 0.
absl::Status ReadGeneration(const MapReader& top, bool new_file, GenerationConfig* g);

}  // namespace qlora::config_internal
