// Field-by-field equality of JobConfig and its parts (declared in job_config.h).
#include <tuple>

#include "common/config/job_config.h"

namespace qlora {

// Tripwire: a field added to job_config.h changes these sizes. Then add it to operator== below,
// to ParseJobConfig (with its default and checks), to EmitResolvedJobYaml and to the schema, and
// update the size. (Sizes of x86-64 libstdc++, where the project builds.)
#if defined(__x86_64__) && defined(__GLIBCXX__)
static_assert(sizeof(FeatureConfig) == 64, "FeatureConfig changed: see the note above");
static_assert(sizeof(QuantizationConfig) == 28, "QuantizationConfig changed: see the note above");
static_assert(sizeof(LoraConfig) == 88, "LoraConfig changed: see the note above");
static_assert(sizeof(StrategyConfig) == 88, "StrategyConfig changed: see the note above");
static_assert(sizeof(BackendConfig) == 112, "BackendConfig changed: see the note above");
static_assert(sizeof(TrainerConfig) == 312, "TrainerConfig changed: see the note above");
static_assert(sizeof(DataConfig) == 144, "DataConfig changed: see the note above");
static_assert(sizeof(GenerationConfig) == 120, "GenerationConfig changed: see the note above");
static_assert(sizeof(JobConfig) == 1080, "JobConfig changed: see the note above");
#endif

bool operator==(const FeatureConfig& a, const FeatureConfig& b) {
  return std::tie(a.name, a.type) == std::tie(b.name, b.type);
}

bool operator==(const QuantizationConfig& a, const QuantizationConfig& b) {
  return std::tie(a.enabled, a.bits, a.quant_type, a.double_quant, a.compute_dtype,
                  a.blocksize, a.float8_base_forward) ==
         std::tie(b.enabled, b.bits, b.quant_type, b.double_quant, b.compute_dtype, b.blocksize,
                  b.float8_base_forward);
}

bool operator==(const LoraConfig& a, const LoraConfig& b) {
  return std::tie(a.r, a.alpha, a.dropout, a.target_modules, a.use_rslora,
                  a.merge_adapter_into_base_model, a.pretrained_adapter_path) ==
         std::tie(b.r, b.alpha, b.dropout, b.target_modules, b.use_rslora,
                  b.merge_adapter_into_base_model, b.pretrained_adapter_path);
}

bool operator==(const StrategyConfig& a, const StrategyConfig& b) {
  return std::tie(a.type, a.zero_stage, a.zero_stage_reason, a.reduce_bucket_size,
                  a.allgather_bucket_size, a.overlap_comm, a.contiguous_gradients, a.zero_stage_auto,
                  a.offload_param, a.offload_param_pin_memory, a.offload_optimizer,
                  a.offload_optimizer_pin_memory, a.stage3_knobs) ==
         std::tie(b.type, b.zero_stage, b.zero_stage_reason, b.reduce_bucket_size,
                  b.allgather_bucket_size, b.overlap_comm, b.contiguous_gradients, b.zero_stage_auto,
                  b.offload_param, b.offload_param_pin_memory, b.offload_optimizer,
                  b.offload_optimizer_pin_memory, b.stage3_knobs);
}

bool operator==(const BackendConfig& a, const BackendConfig& b) {
  return std::tie(a.type, a.use_gpu, a.num_workers, a.min_workers, a.placement, a.cpus_per_worker, a.strategy) ==
         std::tie(b.type, b.use_gpu, b.num_workers, b.min_workers, b.placement, b.cpus_per_worker, b.strategy);
}

bool operator==(const TrainerConfig& a, const TrainerConfig& b) {
  return std::tie(a.type, a.batch_size, a.gradient_accumulation_steps, a.eval_batch_size,
                  a.learning_rate, a.epochs, a.train_steps, a.optimizer, a.weight_decay,
                  a.beta1, a.beta2, a.eps, a.lr_scheduler, a.warmup_fraction, a.max_grad_norm,
                  a.steps_per_checkpoint, a.eval_steps, a.gradient_checkpointing, a.seed,
                  a.max_restarts, a.keep_checkpoints, a.checkpoint_every_minutes,
                  a.max_memory_gib, a.max_host_memory_gib, a.offload_activation_layers, a.offload_activation_auto, a.resume_from_checkpoint, a.report_to_mlflow, a.eval_samples, a.eval_prompts,
                  a.dequantized_weight_layers, a.dequantized_weights_auto, a.beta, a.loss_type, a.label_smoothing) ==
         std::tie(b.type, b.batch_size, b.gradient_accumulation_steps, b.eval_batch_size,
                  b.learning_rate, b.epochs, b.train_steps, b.optimizer, b.weight_decay,
                  b.beta1, b.beta2, b.eps, b.lr_scheduler, b.warmup_fraction, b.max_grad_norm,
                  b.steps_per_checkpoint, b.eval_steps, b.gradient_checkpointing, b.seed,
                  b.max_restarts, b.keep_checkpoints, b.checkpoint_every_minutes,
                  b.max_memory_gib, b.max_host_memory_gib, b.offload_activation_layers, b.offload_activation_auto, b.resume_from_checkpoint, b.report_to_mlflow, b.eval_samples, b.eval_prompts,
                  b.dequantized_weight_layers, b.dequantized_weights_auto, b.beta, b.loss_type, b.label_smoothing);
}

bool operator==(const DataConfig& a, const DataConfig& b) {
  return std::tie(a.train_path, a.validation_path, a.validation_fraction, a.test_fraction, a.format,
                  a.prompt_template, a.max_sequence_length, a.packing, a.malformed_records,
                  a.max_without_target_fraction) ==
         std::tie(b.train_path, b.validation_path, b.validation_fraction, b.test_fraction, b.format,
                  b.prompt_template, b.max_sequence_length, b.packing, b.malformed_records,
                  b.max_without_target_fraction);
}

bool operator==(const GenerationConfig& a, const GenerationConfig& b) {
  return std::tie(a.temperature, a.top_p, a.repetition_penalty, a.max_new_tokens, a.min_new_tokens,
                  a.top_k, a.num_beams, a.do_sample) ==
         std::tie(b.temperature, b.top_p, b.repetition_penalty, b.max_new_tokens, b.min_new_tokens,
                  b.top_k, b.num_beams, b.do_sample);
}

bool operator==(const JobConfig& a, const JobConfig& b) {
  return std::tie(a.name, a.model_type, a.base_model, a.base_model_path, a.input_features,
                  a.output_features, a.adapter_type, a.lora, a.quantization, a.backend,
                  a.trainer, a.data, a.generation, a.output_dir, a.gguf_type) ==
         std::tie(b.name, b.model_type, b.base_model, b.base_model_path, b.input_features,
                  b.output_features, b.adapter_type, b.lora, b.quantization, b.backend,
                  b.trainer, b.data, b.generation, b.output_dir, b.gguf_type);
}

}  // namespace qlora
