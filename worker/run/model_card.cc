// README.md of the adapter folder (see model_card.h).
#include "worker/run/model_card.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/config/config_enums.h"
#include "common/posix_files.h"
#include "nlohmann/json.hpp"

namespace qlora::worker {
namespace {

using Rows = std::vector<std::pair<std::string, std::string>>;

// A YAML double-quoted scalar (JSON's string syntax is a subset of YAML's).
std::string Quoted(const std::string& s) { return nlohmann::json(s).dump(); }

std::string FileName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A Markdown table cell: no line breaks, no column separators.
std::string Cell(const std::string& s) {
  return absl::StrReplaceAll(s, {{"|", "\\|"}, {"\n", " "}, {"\r", " "}});
}

std::string Table(const char* key, const char* value, const Rows& rows) {
  std::string out = absl::StrCat("| ", key, " | ", value, " |\n|---|---|\n");
  for (const auto& [k, v] : rows) absl::StrAppend(&out, "| ", Cell(k), " | ", Cell(v), " |\n");
  return out;
}

std::string Loss(double v) { return std::isnan(v) ? "n/a" : absl::StrFormat("%.4f", v); }
std::string Number(double v) { return absl::StrFormat("%.4g", v); }

Rows Hyperparameters(const JobConfig& c, int world_size) {
  const TrainerConfig& t = c.trainer;
  Rows rows = {
      {"adapter", absl::StrCat("LoRA r=", c.lora.r, ", alpha=", Number(c.lora.alpha),
                               ", dropout=", Number(c.lora.dropout), c.lora.use_rslora ? ", rsLoRA" : "")},
      {"target_modules", absl::StrJoin(c.lora.target_modules, ", ")},
      {"quantization", c.quantization.enabled
                           ? absl::StrCat(c.quantization.bits, "-bit ", EnumName(c.quantization.quant_type),
                                          c.quantization.double_quant ? ", double quantization" : "")
                           : "none"},
      {"learning_rate", Number(t.learning_rate)},
      {"lr_scheduler", absl::StrCat(EnumName(t.lr_scheduler), ", warmup ", Number(t.warmup_fraction))},
      {"optimizer", absl::StrCat(EnumName(t.optimizer), " (betas ", Number(t.beta1), ", ", Number(t.beta2),
                                 ", eps ", Number(t.eps), ", weight decay ", Number(t.weight_decay), ")")},
      {"max_grad_norm", Number(t.max_grad_norm)},
      {"micro_batch_size", absl::StrCat(t.batch_size)},
      {"gradient_accumulation_steps", absl::StrCat(t.gradient_accumulation_steps)},
      {"data_parallel_ranks", absl::StrCat(world_size)},
      {"total_batch_size", absl::StrCat(int64_t{t.batch_size} * t.gradient_accumulation_steps * world_size)},
      {"epochs", t.train_steps > 0 ? "by steps" : absl::StrCat(t.epochs)},
      {"max_sequence_length", absl::StrCat(c.data.max_sequence_length)},
      {"packing", c.data.packing ? "yes" : "no"},
      {"zero_stage", absl::StrCat(c.backend.strategy.zero_stage)},
      {"seed", absl::StrCat(t.seed)},
  };
  return rows;
}

Rows Results(const TrainSummary& s) {
  return {
      {"train_loss (mean over the run)", Loss(s.train_loss)},
      {"final train loss", Loss(s.final_train_loss)},
      {"eval_loss (final)", Loss(s.eval_loss)},
      {"best eval_loss", Loss(s.best_eval_loss)},
      {"steps", absl::StrCat(s.steps, s.global_step != s.steps ? absl::StrCat(" (", s.global_step, " in all)") : "")},
      {"samples", absl::StrCat(s.samples)},
      {"tokens", absl::StrCat(s.tokens)},
      {"train_runtime", absl::StrFormat("%.1f s", s.train_runtime_seconds)},
      {"train_samples_per_second", Number(s.train_samples_per_second)},
      {"train_steps_per_second", Number(s.train_steps_per_second)},
      {"tokens_per_second", Number(s.tokens_per_second)},
      {"peak_memory", absl::StrFormat("%.1f MiB", s.peak_memory_bytes / (1024.0 * 1024.0))},
  };
}

}  // namespace

std::string RenderModelCard(const ModelCardOptions& options) {
  const JobConfig& c = *options.config;
  std::string card = "---\n";
  absl::StrAppend(&card, "base_model: ", Quoted(c.base_model), "\n");
  absl::StrAppend(&card, "library_name: peft\npipeline_tag: text-generation\ntags:\n");
  absl::StrAppend(&card, "- ", Quoted("base_model:adapter:" + c.base_model), "\n- lora\n");
  if (c.quantization.enabled) absl::StrAppend(&card, "- qlora\n");
  absl::StrAppend(&card, "- transformers\n---\n\n");

  absl::StrAppend(&card, "# ", Cell(c.name.empty() ? "LoRA adapter" : c.name), "\n\n");
  absl::StrAppend(&card, "A LoRA adapter (peft's format) for `",
                  Cell(c.base_model), "`, fine-tuned", c.quantization.enabled ? " with QLoRA" : "",
                  ".\n\n");
  absl::StrAppend(&card, "## Training data\n\n- train: `", Cell(FileName(c.data.train_path)), "`\n");
  if (!c.data.validation_path.empty()) {
    absl::StrAppend(&card, "- validation: `", Cell(FileName(c.data.validation_path)), "`\n");
  } else if (c.data.validation_fraction > 0) {
    absl::StrAppend(&card, "- validation: ", Number(c.data.validation_fraction), " of the train data\n");
  }
  absl::StrAppend(&card, "\n## Hyperparameters\n\n",
                  Table("name", "value", Hyperparameters(c, options.world_size)));
  absl::StrAppend(&card, "\n## Results\n\n", Table("metric", "value", Results(options.summary)));
  absl::StrAppend(&card, "\n## Use\n\n```python\nfrom peft import AutoPeftModelForCausalLM\n\n"
                         "model = AutoPeftModelForCausalLM.from_pretrained(\"path/to/this/folder\")\n```\n");
  return card;
}

absl::Status WriteModelCard(const std::string& adapter_dir, const ModelCardOptions& options) {
  return WriteFileAtomically(JoinPath(adapter_dir, kModelCardFile), RenderModelCard(options));
}

}  // namespace qlora::worker
