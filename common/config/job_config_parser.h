// ParseJobConfig: a job file (Ludwig-style YAML) -> a validated JobConfig with every default
// resolved. This is the only place defaults are chosen; see job_config.h for the fields.
//
// Accepted: the original Ludwig/DeepSpeed job file verbatim, plus the service's own fields:
//
//   name: my-run                    # optional
//   dataset: train.jsonl            # or ParseOptions::dataset_override (--dataset)
//   validation_dataset: val.jsonl   # optional
//   output_dir: /runs/my-run        # optional
//   data: {format: auto, prompt_template: "...", max_sequence_length: 512, packing: false,
//          malformed_records: fail, validation_fraction: 0.0, test_fraction: 0.0}
//
// and Ludwig's LLM sections, mapped onto those (ludwig_sections.h; a key given both ways must
// agree): prompt.template, preprocessing.split {type: random, probabilities},
// preprocessing.global_max_sequence_length, and generation (kept with the job, not used by
// training).
//
// Defaults that differ from Ludwig's (this is a QLoRA service; the JobConfig member initializers
// hold the rest):
//   quantization absent: 4-bit NF4 (`quantization: null` turns it off);
//   input_features / output_features absent: [{name: instruction}] / [{name: output}];
//   adapter: required (only LoRA is trained); target_modules absent: [q_proj, v_proj];
//   backend.trainer.strategy absent: deepspeed with the stage chosen below.
//
// Shapes that Ludwig leaves open, as this parser reads them:
//   trainer.optimizer: a mapping {type: adamw|adam, weight_decay: 0.0, betas: [0.9, 0.999],
//       eps: 1e-8}, or the bare type name (`optimizer: adamw`). Paged and 8-bit optimizers are
//       refused (DeepSpeed refuses them too).
//   trainer.learning_rate_scheduler: {decay: cosine|linear|none, warmup_fraction: 0.03};
//       decay none (or null) is a constant rate after warmup.
//   backend.trainer.strategy: "deepspeed", "ddp", or {type, zero_optimization: {stage,
//       reduce_bucket_size, allgather_bucket_size, overlap_comm, contiguous_gradients,
//       offload_param and offload_optimizer: {device: cpu|none, pin_memory}, stage3_* tuning
//       keys (no effect)},
//       fp16: {enabled}, bf16: {enabled}}. fp16/bf16 are checked against
//       quantization.bnb_4bit_compute_dtype, which alone sets the compute dtype.
//   adapter.target_modules: a list of LLaMA module names or "all-linear" (the 7 linear layers).
//   quantization.blocksize: the 4-bit quantization block size (64 as bitsandbytes).
//
// The ZeRO stage (StrategyConfig::zero_stage/zero_stage_reason): a stage written in the file is
// kept; `ddp` is stage 0; no stage (or `stage: auto`) picks 2 and says why.
//
// adapter.postprocessor.merge_adapter_into_base_model is allowed with 4-bit quantization (Ludwig
// refuses merging into a 4-bit model) because the merge writes into a dequantized bf16 copy of
// the base weights, never into the 4-bit tensors.
//
// Errors (all messages are fit to show a user as they are):
//   INVALID_ARGUMENT  "<source>:<line>: <field.path>: <problem>" for bad YAML, wrong types,
//                     out-of-range values, unknown keys (with the closest valid name), rule
//                     violations, a missing dataset, a file over max_bytes.
//   NOT_FOUND         a dataset file, or a base_model written as a path, does not exist
//                     (check_paths only).
//   FAILED_PRECONDITION  base_model is neither a local HF folder nor in the local Hugging Face
//                     cache (check_paths only); the message says how to download it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"

namespace qlora {

struct ParseOptions {
  // Names the file in error messages ("job.yaml:12: trainer.batch_size: ...").
  std::string source_name = "job.yaml";
  // Non-empty: replaces the file's `dataset` / `validation_dataset` (the CLI's --dataset).
  std::string dataset_override;
  std::string validation_dataset_override;
  // Check that the dataset files exist and resolve base_model to a local folder. When false,
  // paths are kept as written and base_model_path is base_model (or the file's base_model_path).
  bool check_paths = true;
  // The Hugging Face hub cache. Empty = $HF_HUB_CACHE, else $HF_HOME/hub, else
  // $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
  std::string hf_hub_cache;
  // Relative paths in the file (dataset, validation_dataset, a local base_model, output_dir)
  // resolve against this folder; empty = the process's working directory.
  std::string base_dir;
  // With check_paths: called with each dataset path and local model folder (absolute, lexically
  // normal) before anything looks at it; its error is returned as is. The coordinator refuses
  // here what lies outside its read roots, so that nothing outside them is even stat'ed.
  std::function<absl::Status(absl::string_view field, const std::string& path)> before_touching;
  // Non-empty: replaces the file's `name` (the CLI's --name), with the same checks.
  std::string name_override;
  // Larger inputs are refused before parsing.
  size_t max_bytes = 1 << 20;
  // A stored resolved copy (ParseResolvedJobConfig): combinations that only newer versions
  // refuse at submit are let through, so that a job accepted before an upgrade still runs.
  bool stored = false;
};

// Parses and validates one job file. With check_paths, dataset paths and base_model_path come
// back absolute.
absl::StatusOr<JobConfig> ParseJobConfig(std::string_view yaml_text, const ParseOptions& options);

// Parses what EmitResolvedJobYaml wrote (the copy the coordinator stores and hands to its
// workers): its paths were resolved at submission, so they are not checked again.
absl::StatusOr<JobConfig> ParseResolvedJobConfig(std::string_view resolved_yaml);

}  // namespace qlora
