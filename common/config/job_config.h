// The typed, validated, fully resolved configuration of one training job.
//
// A job file (Ludwig-style YAML, see docs/job-file.md) is parsed exactly once into this
// struct by ParseJobConfig (job_config_parser.h), which resolves every default in one place
// (the ZeRO stage included). Everything downstream -- coordinator, worker, engine, strategy,
// data path -- reads only this struct. No torch, no protobuf here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/config/config_enums.h"

namespace qlora {

struct FeatureConfig {
  std::string name;          // column name in the dataset
  std::string type = "text"; // only "text" is supported
};

struct QuantizationConfig {
  bool enabled = true;                      // `quantization: null` disables it
  int bits = 4;                             // 4 only (8-bit is refused with a clear error)
  QuantType quant_type = QuantType::kNF4;
  bool double_quant = true;                 // bnb_4bit_use_double_quant
  ComputeDtype compute_dtype = ComputeDtype::kBFloat16;  // bnb_4bit_compute_dtype
  int blocksize = 64;                       // 32..4096, power of two
  // The frozen base's forward GEMMs in FP8 e4m3 with one scale per row (opt-in; needs bfloat16
  // compute and FP8 tensor cores): worker/engine/float8_forward.h, docs/float8.md.
  bool float8_base_forward = false;
};

struct LoraConfig {
  int r = 8;
  double alpha = 16.0;
  double dropout = 0.05;
  // HF module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) or the
  // single entry "all-linear". Resolved: never empty after parsing (default q_proj, v_proj,
  // as PEFT picks for LLaMA); "all-linear" is expanded to the 7 names above, in that order.
  std::vector<std::string> target_modules;
  bool use_rslora = false;                  // scale = alpha / sqrt(r) instead of alpha / r
  // Also write merged HF safetensors. Allowed with 4-bit quantization (Ludwig refuses it)
  // because the merge goes into a dequantized bf16 copy of the base weights, never into the
  // 4-bit tensors.
  bool merge_adapter_into_base_model = false;
  // adapter.pretrained_adapter_weights: a PEFT adapter folder (ours or peft's) whose weights the
  // adapters start from; its r, alpha, target modules and rsLoRA must be the job's. Absolute
  // once paths are checked; empty: adapters start as peft initializes them.
  std::string pretrained_adapter_path;
};

struct StrategyConfig {
  StrategyType type = StrategyType::kDeepSpeed;  // ddp == stage 0
  int zero_stage = 2;                       // resolved: 0-3 (3: the base weights partitioned)
  std::string zero_stage_reason;            // why: "set in the job file" or the default's reason
  int64_t reduce_bucket_size = 500000000;   // elements
  int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  // The stage is the workers' to plan from the memory budget (no stage written, or stage: auto;
  // worker/memory/base_weight_plan.h): zero_stage holds the floor (2) until they do. The resolved
  // file says stage: auto.
  bool zero_stage_auto = false;
  // offload_param: {device: cpu}: the frozen base weights wait in host memory (pinned unless
  // pin_memory: false) and are copied to the GPU a layer ahead of use, on any stage.
  bool offload_param = false;
  bool offload_param_pin_memory = true;
  // offload_optimizer: {device: cpu}: the AdamW moments wait in host memory (pinned unless
  // pin_memory: false) between steps and travel to the GPU for each step's update there.
  bool offload_optimizer = false;
  bool offload_optimizer_pin_memory = true;
  // DeepSpeed's stage-3 tuning keys as written (key, scalar text): accepted with no effect here
  // (the schema's text for each says why); the resolved file shows them with that text.
  std::vector<std::pair<std::string, std::string>> stage3_knobs;
};

struct BackendConfig {
  BackendType type = BackendType::kLocal;   // ray: on the coordinator's Ray cluster (--ray-address)
  bool use_gpu = true;                      // false: CPU workers (true: GPUs where there are any)
  int num_workers = 0;                      // 0 = every GPU of the machine (or --cpu-workers)
  // Elastic: when fewer than num_workers can be had for good at a (re)start (a GPU or a cluster
  // node lost), the job goes on with as many as there are, down to this many; 0 = never fewer.
  int min_workers = 0;
  // Ray only: how the bundles of one job are placed, and each bundle's CPUs
  // (resources_per_worker.CPU; a CPU worker also uses that many threads).
  PlacementStrategy placement = PlacementStrategy::kPack;
  int cpus_per_worker = 1;
  StrategyConfig strategy;
};

struct TrainerConfig {
  TrainerType type = TrainerType::kFinetune;
  // Preference tuning (type dpo or orpo), with TRL's names: beta is DPO's KL weight (the
  // reward's scale) and ORPO's lambda (the odds-ratio term's weight); loss_type and
  // label_smoothing (robust DPO only) are DPO's.
  double beta = 0.1;
  PreferenceLoss loss_type = PreferenceLoss::kSigmoid;
  double label_smoothing = 0;
  int batch_size = 1;                       // micro-batch per worker (pairs for dpo/orpo)
  int gradient_accumulation_steps = 1;
  int eval_batch_size = 2;
  double learning_rate = 2e-4;
  int epochs = 3;
  int64_t train_steps = 0;                  // 0 = from epochs
  OptimizerType optimizer = OptimizerType::kAdamW;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  LrScheduler lr_scheduler = LrScheduler::kCosine;
  double warmup_fraction = 0.03;
  double max_grad_norm = 0.3;               // gradient_clipping.clipglobalnorm; 0 = off
  int64_t steps_per_checkpoint = 0;         // 0 = only at the end
  // Also a checkpoint once this many minutes have passed since the last one (or the start), at
  // the next optimizer step, decided by rank 0 for all; 0 = by steps only. Bounds the work a
  // failure loses when steps_per_checkpoint is left at 0.
  double checkpoint_every_minutes = 10;
  // Automatic restarts from the last checkpoint after a worker fails; -1 = the coordinator's
  // default (--max-restarts), 0 = none.
  int64_t max_restarts = -1;
  int64_t keep_checkpoints = 2;             // the newest complete ones kept; 0 = all
  int64_t eval_steps = 0;                   // 0 = evaluate at the end of each epoch
  // At each evaluation, generate for these prompts (eval_prompts) or, without them, for the
  // first eval_samples records of the validation file (else the training file): TensorBoard's
  // TEXT tab, metrics.jsonl, the worker's log. 0 and none: off.
  int64_t eval_samples = 0;
  std::vector<std::string> eval_prompts;
  // enable_gradient_checkpointing: true (every decoder layer is activation-checkpointed), false
  // (none), or auto: the worker leaves as many of the last layers uncheckpointed as fit
  // max_memory_gib and reports its choice (worker/memory/activation_plan.h).
  CheckpointingMode gradient_checkpointing = CheckpointingMode::kAll;
  // With auto only (the parser refuses it otherwise): the per-GPU budget in GiB (2^30 bytes) for
  // what PyTorch allocates during a step. 0 = unset: the GPU's free memory when the worker
  // starts; on a CPU worker, unset means every layer checkpointed.
  double max_memory_gib = 0;
  // On a GPU: this many decoder layers keep what they save for backward in pinned host memory
  // instead of being recomputed or holding device memory (worker/engine/activation_offload.h);
  // taken from the checkpointed layers first. 0 = off. Ignored on a CPU worker.
  int64_t offload_activation_layers = 0;
  // offload_activation_layers: auto (the count above unused): the worker measures its host link
  // and GEMM rate and offloads as many layers as the link keeps up with (copies out, their
  // backlog, copies back) where that spares recomputation (worker/memory/activation_offload_plan.h); none
  // without checkpointing.
  bool offload_activation_auto = false;
  // With offload_activation_layers: auto only (the parser refuses it otherwise): the host memory
  // in GiB that this rank's offloaded activations may pin. 0 = unset: half of what the host has
  // available when the worker plans, shared with the other ranks (which may all run on this host).
  // The longest rows need more: every checkpointed layer's input waits in host memory.
  double max_host_memory_gib = 0;
  // This many decoder layers (the top ones) hold their 4-bit weights dequantized in the compute
  // dtype for the whole job (worker/engine/dequantized_layers.h): no dequantization in their
  // forward or backward, ~2 bytes per weight more each (~0.4 GB a 7B layer). 0 = off.
  int64_t dequantized_weight_layers = 0;
  // dequantized_weight_layers: auto (the count above unused): after the first step, as many
  // layers as fit between that step's measured peak and the budget (max_memory_gib, else the
  // GPU's free memory at the start) less 2 %; none on a CPU worker.
  bool dequantized_weights_auto = false;
  uint64_t seed = 42;
  // A complete checkpoint folder (<output>/checkpoints/<job>/step-N, with its manifest.json)
  // that this job continues from: its adapters, optimizer state and step, and the data order
  // replayed to that step. Absolute once paths were checked. Set by `qloractl submit
  // --resume-from JOB` (the newest checkpoint of JOB) or written by hand; "" = a fresh start.
  // The job's own checkpoints, once it has any, come first (a restart resumes from them).
  std::string resume_from_checkpoint;
  // report_to (HF TrainingArguments' key): TensorBoard files are always written; with mlflow,
  // rank 0 also reports to the MLflow tracking server the environment names (MLFLOW_*).
  bool report_to_mlflow = false;
};

struct DataConfig {
  std::string train_path;                   // dataset (or --dataset); absolute when paths
                                            // were checked (ParseOptions::check_paths)
  std::string validation_path;              // optional (validation_dataset)
  double validation_fraction = 0.0;         // split of train when no validation file
  double test_fraction = 0.0;               // held out of train: never trained nor validated
  DatasetFormat format = DatasetFormat::kAuto;
  std::string prompt_template;              // empty = default for instruction/output data
  int max_sequence_length = 512;
  bool packing = false;
  MalformedRecords malformed_records = MalformedRecords::kFail;
  // The largest fraction of the records read so far that may be left without a target (cut to
  // max_sequence_length before their first target token, so never trained on) before the job
  // fails; 1: never fails (the coordinator warns while the job runs either way).
  double max_without_target_fraction = 1.0;
};

// Ludwig's `generation:` section: how to generate with the trained adapter. Kept with the job
// (stored, emitted back) for later use; training does not read it. Unset = the generator's
// default.
struct GenerationConfig {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_new_tokens;
  std::optional<int64_t> min_new_tokens;
  std::optional<int64_t> top_k;
  std::optional<int64_t> num_beams;
  std::optional<bool> do_sample;
};

struct JobConfig {
  std::string name;                         // optional human name
  std::string model_type = "llm";
  std::string base_model;                   // as written in the file
  std::string base_model_path;              // resolved local folder (HF cache resolution)
  std::vector<FeatureConfig> input_features;
  std::vector<FeatureConfig> output_features;
  std::string adapter_type = "lora";        // adapter.type
  LoraConfig lora;
  QuantizationConfig quantization;
  BackendConfig backend;
  TrainerConfig trainer;
  DataConfig data;
  GenerationConfig generation;
  std::string output_dir;                   // empty = the coordinator's state folder
  // output.gguf: also write the merged model as <output_dir>/model-<type>.gguf (worker/export):
  // "" none, else f16 | bf16 | q8_0 | f32. Implies merge_adapter_into_base_model.
  std::string gguf_type;
};

// Field-by-field equality (tests compare a parsed config with its re-parsed emission). Defined
// in job_config_compare.cc; a field added above must be added there too.
bool operator==(const FeatureConfig& a, const FeatureConfig& b);
bool operator==(const QuantizationConfig& a, const QuantizationConfig& b);
bool operator==(const LoraConfig& a, const LoraConfig& b);
bool operator==(const StrategyConfig& a, const StrategyConfig& b);
bool operator==(const BackendConfig& a, const BackendConfig& b);
bool operator==(const TrainerConfig& a, const TrainerConfig& b);
bool operator==(const DataConfig& a, const DataConfig& b);
bool operator==(const GenerationConfig& a, const GenerationConfig& b);
bool operator==(const JobConfig& a, const JobConfig& b);
inline bool operator!=(const JobConfig& a, const JobConfig& b) { return !(a == b); }

// Whether the job tunes on preference pairs (trainer.type dpo or orpo).
inline bool IsPreferenceJob(const JobConfig& job) {
  return job.trainer.type == TrainerType::kDpo || job.trainer.type == TrainerType::kOrpo;
}

// Rows of a micro-batch: trainer.batch_size, twice that for preference pairs (a chosen and a
// rejected row each): what the memory plans size activations by.
inline int RowsPerMicroBatch(const JobConfig& job) {
  return job.trainer.batch_size * (IsPreferenceJob(job) ? 2 : 1);
}

}  // namespace qlora
