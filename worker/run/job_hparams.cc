// The job-file keys shown as TensorBoard hyperparameters (see job_hparams.h).
#include "worker/run/job_hparams.h"

#include "absl/strings/str_join.h"

namespace qlora::worker {

std::vector<tensorboard::HParam> JobHParams(const JobConfig& c, int world_size) {
  const TrainerConfig& t = c.trainer;
  return {
      {"base_model", c.base_model},
      {"adapter.r", static_cast<double>(c.lora.r)},
      {"adapter.alpha", static_cast<double>(c.lora.alpha)},
      {"adapter.dropout", c.lora.dropout},
      {"adapter.target_modules", absl::StrJoin(c.lora.target_modules, ",")},
      {"adapter.use_rslora", c.lora.use_rslora},
      {"quantization", c.quantization.enabled ? std::string(EnumName(c.quantization.quant_type)) : std::string("none")},
      {"trainer.learning_rate", t.learning_rate},
      {"trainer.batch_size", static_cast<double>(t.batch_size)},
      {"trainer.gradient_accumulation_steps", static_cast<double>(t.gradient_accumulation_steps)},
      {"trainer.epochs", static_cast<double>(t.epochs)},
      {"trainer.train_steps", static_cast<double>(t.train_steps)},
      {"trainer.learning_rate_scheduler", std::string(EnumName(t.lr_scheduler))},
      {"trainer.warmup_fraction", t.warmup_fraction},
      {"trainer.weight_decay", t.weight_decay},
      {"trainer.max_grad_norm", t.max_grad_norm},
      {"trainer.seed", static_cast<double>(t.seed)},
      {"data.max_sequence_length", static_cast<double>(c.data.max_sequence_length)},
      {"data.packing", c.data.packing},
      {"zero_stage", static_cast<double>(c.backend.strategy.zero_stage)},
      {"workers", static_cast<double>(world_size)},
  };
}

std::vector<std::string> JobHParamMetrics() { return {"train/loss", "eval/loss"}; }

}  // namespace qlora::worker
