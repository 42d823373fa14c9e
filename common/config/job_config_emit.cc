// The canonical YAML form of a resolved JobConfig.
#include "common/config/job_config_emit.h"

#include <cstdio>
#include <cstdlib>

#include "common/config/job_config_schema.h"
#include "yaml-cpp/yaml.h"

namespace qlora {
namespace {

// The shortest decimal form that reads back as exactly `value`.
std::string ExactNumber(double value) {
  char buffer[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

// Helpers that keep the emitting code to one line per field.
class Writer {
 public:
  Writer& Text(const char* key, const std::string& value) {
    out_ << YAML::Key << key << YAML::Value << YAML::DoubleQuoted << value;
    return *this;
  }
  Writer& Word(const char* key, const std::string& value) {  // enum-like values
    out_ << YAML::Key << key << YAML::Value << value;
    return *this;
  }
  Writer& Number(const char* key, double value) { return Word(key, ExactNumber(value)); }
  template <typename Int>
  Writer& Integer(const char* key, Int value) {
    out_ << YAML::Key << key << YAML::Value << value;
    return *this;
  }
  Writer& Bool(const char* key, bool value) {
    out_ << YAML::Key << key << YAML::Value << YAML::TrueFalseBool << value;
    return *this;
  }
  Writer& Begin(const char* key, bool flow = false) {
    out_ << YAML::Key << key << YAML::Value;
    if (flow) out_ << YAML::Flow;
    out_ << YAML::BeginMap;
    return *this;
  }
  Writer& End() {
    out_ << YAML::EndMap;
    return *this;
  }
  YAML::Emitter& raw() { return out_; }

 private:
  YAML::Emitter out_;
};

void WriteFeatures(Writer& w, const char* key, const std::vector<FeatureConfig>& features) {
  w.raw() << YAML::Key << key << YAML::Value << YAML::BeginSeq;
  for (const FeatureConfig& f : features) {
    w.raw() << YAML::Flow << YAML::BeginMap;
    w.Text("name", f.name).Word("type", f.type).End();
  }
  w.raw() << YAML::EndSeq;
}

void WriteStrategy(Writer& w, const StrategyConfig& s) {
  w.Begin("strategy").Word("type", EnumName(s.type));
  if (s.type != StrategyType::kDdp) {
    // Accepted so that DeepSpeed job files run unchanged, but nothing reads them: the resolved
    // copy says so next to each.
    constexpr char kNoEffect[] = "accepted for DeepSpeed compatibility; no effect here";
    w.Begin("zero_optimization");
    if (s.zero_stage_auto) {
      w.Word("stage", "auto");
    } else {
      w.Integer("stage", s.zero_stage);
    }
    w.Integer("reduce_bucket_size", s.reduce_bucket_size)
        .Integer("allgather_bucket_size", s.allgather_bucket_size);
    w.raw() << YAML::Comment(kNoEffect);
    w.Bool("overlap_comm", s.overlap_comm);
    w.raw() << YAML::Comment(kNoEffect);
    w.Bool("contiguous_gradients", s.contiguous_gradients);
    w.raw() << YAML::Comment(kNoEffect);
    w.Begin("offload_param", /*flow=*/true)
        .Word("device", s.offload_param ? "cpu" : "none")
        .Bool("pin_memory", s.offload_param_pin_memory)
        .End();
    w.Begin("offload_optimizer", /*flow=*/true)
        .Word("device", s.offload_optimizer ? "cpu" : "none")
        .Bool("pin_memory", s.offload_optimizer_pin_memory)
        .End();
    const config_internal::SchemaNode* zero = config_internal::JobFileSchema()
                                                  .Child("backend")
                                                  ->Child("trainer")
                                                  ->Child("strategy")
                                                  ->Child("zero_optimization");
    for (const auto& [key, value] : s.stage3_knobs) {
      w.Word(key.c_str(), value);
      w.raw() << YAML::Comment(zero->Child(key)->doc);
    }
    w.End();
  }
  w.Text("zero_stage_reason", s.zero_stage_reason).End();
}

void WriteTrainer(Writer& w, const TrainerConfig& t) {
  w.Begin("trainer")
      .Word("type", EnumName(t.type));
  if (t.type == TrainerType::kDpo || t.type == TrainerType::kOrpo) {
    w.Number("beta", t.beta);
    if (t.type == TrainerType::kDpo) {
      w.Word("loss_type", EnumName(t.loss_type)).Number("label_smoothing", t.label_smoothing);
    }
  }
  w.Integer("batch_size", t.batch_size)
      .Integer("eval_batch_size", t.eval_batch_size)
      .Integer("gradient_accumulation_steps", t.gradient_accumulation_steps)
      .Number("learning_rate", t.learning_rate)
      .Integer("epochs", t.epochs)
      .Integer("train_steps", t.train_steps);
  w.Begin("optimizer").Word("type", EnumName(t.optimizer)).Number("weight_decay", t.weight_decay);
  w.raw() << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
          << ExactNumber(t.beta1) << ExactNumber(t.beta2) << YAML::EndSeq;
  w.Number("eps", t.eps).End();
  w.Begin("learning_rate_scheduler")
      .Word("decay", EnumName(t.lr_scheduler))
      .Number("warmup_fraction", t.warmup_fraction)
      .End();
  w.Begin("gradient_clipping").Number("clipglobalnorm", t.max_grad_norm).End();
  w.Word("enable_gradient_checkpointing", EnumName(t.gradient_checkpointing));
  if (t.max_memory_gib > 0) w.Number("max_memory_gib", t.max_memory_gib);  // 0: the worker's GPU
  if (t.offload_activation_auto) {
    w.Word("offload_activation_layers", "auto");
    if (t.max_host_memory_gib > 0) w.Number("max_host_memory_gib", t.max_host_memory_gib);
  } else if (t.offload_activation_layers > 0) {
    w.Integer("offload_activation_layers", t.offload_activation_layers);
  }
  if (t.dequantized_weights_auto) {
    w.Word("dequantized_weight_layers", "auto");
  } else if (t.dequantized_weight_layers > 0) {
    w.Integer("dequantized_weight_layers", t.dequantized_weight_layers);
  }
  w.Integer("steps_per_checkpoint", t.steps_per_checkpoint)
      .Number("checkpoint_every_minutes", t.checkpoint_every_minutes)
      .Integer("eval_steps", t.eval_steps)
      .Integer("eval_samples", t.eval_samples)
      .Integer("seed", t.seed)
      .Integer("keep_checkpoints", t.keep_checkpoints);
  if (t.max_restarts >= 0) w.Integer("max_restarts", t.max_restarts);  // -1: not resolved yet
  if (!t.resume_from_checkpoint.empty()) w.Text("resume_from_checkpoint", t.resume_from_checkpoint);
  if (!t.eval_prompts.empty()) {
    w.raw() << YAML::Key << "eval_prompts" << YAML::Value << YAML::DoubleQuoted << YAML::BeginSeq;
    for (const std::string& prompt : t.eval_prompts) w.raw() << YAML::DoubleQuoted << prompt;
    w.raw() << YAML::EndSeq;
  }
  const std::vector<std::string> trackers =
      t.report_to_mlflow ? std::vector<std::string>{"tensorboard", "mlflow"} : std::vector<std::string>{"tensorboard"};
  w.raw() << YAML::Key << "report_to" << YAML::Value << YAML::Flow << trackers;
  w.End();
}

void WriteOutput(Writer& w, const JobConfig& c) {
  if (c.gguf_type.empty()) return;
  w.Begin("output").Word("gguf", c.gguf_type);
  w.raw() << YAML::Comment("also <output_dir>/model-" + c.gguf_type + ".gguf, from the merged model");
  w.End();
}

// Only the keys the job set: the others are the generator's defaults, not this service's. The
// first one says what the section is for.
void WriteGeneration(Writer& w, const GenerationConfig& g) {
  if (g == GenerationConfig{}) return;
  w.Begin("generation");
  bool noted = false;
  auto note = [&] {
    if (!noted) w.raw() << YAML::Comment("kept for inference with the adapter; training does not use it");
    noted = true;
  };
  if (g.temperature) {
    w.Number("temperature", *g.temperature);
    note();
  }
  if (g.top_p) {
    w.Number("top_p", *g.top_p);
    note();
  }
  if (g.repetition_penalty) {
    w.Number("repetition_penalty", *g.repetition_penalty);
    note();
  }
  if (g.max_new_tokens) {
    w.Integer("max_new_tokens", *g.max_new_tokens);
    note();
  }
  if (g.min_new_tokens) {
    w.Integer("min_new_tokens", *g.min_new_tokens);
    note();
  }
  if (g.top_k) {
    w.Integer("top_k", *g.top_k);
    note();
  }
  if (g.num_beams) {
    w.Integer("num_beams", *g.num_beams);
    note();
  }
  if (g.do_sample) {
    w.Bool("do_sample", *g.do_sample);
    note();
  }
  w.End();
}

}  // namespace

std::string EmitResolvedJobYaml(const JobConfig& c) {
  Writer w;
  w.raw() << YAML::Comment("Resolved job configuration: every default filled in by the service.")
          << YAML::Newline;
  w.raw() << YAML::BeginMap;
  w.Text("name", c.name)
      .Word("model_type", c.model_type)
      .Text("base_model", c.base_model)
      .Text("base_model_path", c.base_model_path)
      .Text("dataset", c.data.train_path)
      .Text("validation_dataset", c.data.validation_path)
      .Text("output_dir", c.output_dir);
  WriteFeatures(w, "input_features", c.input_features);
  WriteFeatures(w, "output_features", c.output_features);

  w.Begin("adapter")
      .Word("type", c.adapter_type)
      .Integer("r", c.lora.r)
      .Number("alpha", c.lora.alpha)
      .Number("dropout", c.lora.dropout);
  w.raw() << YAML::Key << "target_modules" << YAML::Value << YAML::Flow << c.lora.target_modules;
  w.Bool("use_rslora", c.lora.use_rslora);
  if (!c.lora.pretrained_adapter_path.empty()) {
    w.Text("pretrained_adapter_weights", c.lora.pretrained_adapter_path);
  }
  w.Begin("postprocessor", /*flow=*/true)
      .Bool("merge_adapter_into_base_model", c.lora.merge_adapter_into_base_model)
      .End()
      .End();

  if (c.quantization.enabled) {
    w.Begin("quantization")
        .Integer("bits", c.quantization.bits)
        .Word("bnb_4bit_quant_type", EnumName(c.quantization.quant_type))
        .Bool("bnb_4bit_use_double_quant", c.quantization.double_quant)
        .Word("bnb_4bit_compute_dtype", EnumName(c.quantization.compute_dtype))
        .Integer("blocksize", c.quantization.blocksize)
        .Bool("float8_base_forward", c.quantization.float8_base_forward)
        .End();
  } else {
    w.raw() << YAML::Key << "quantization" << YAML::Value << YAML::Null;
  }

  w.Begin("backend").Word("type", EnumName(c.backend.type));
  w.Begin("trainer")
      .Bool("use_gpu", c.backend.use_gpu)
      .Integer("num_workers", c.backend.num_workers)
      .Integer("min_workers", c.backend.min_workers)
      .Word("placement_strategy", EnumName(c.backend.placement));
  w.Begin("resources_per_worker")
      .Integer("CPU", c.backend.cpus_per_worker)
      .Integer("GPU", c.backend.use_gpu ? 1 : 0)
      .End();
  WriteStrategy(w, c.backend.strategy);
  w.End().End();

  WriteTrainer(w, c.trainer);

  // Ludwig's prompt and preprocessing keys are read into these; each says which.
  w.Begin("data").Word("format", EnumName(c.data.format));
  w.Text("prompt_template", c.data.prompt_template);
  w.raw() << YAML::Comment("Ludwig: prompt.template");
  w.Integer("max_sequence_length", c.data.max_sequence_length);
  w.raw() << YAML::Comment("Ludwig: preprocessing.global_max_sequence_length");
  w.Bool("packing", c.data.packing)
      .Word("malformed_records", EnumName(c.data.malformed_records))
      .Number("max_without_target_fraction", c.data.max_without_target_fraction)
      .Number("validation_fraction", c.data.validation_fraction);
  w.raw() << YAML::Comment("Ludwig: preprocessing.split.probabilities[1]");
  w.Number("test_fraction", c.data.test_fraction);
  w.raw() << YAML::Comment("Ludwig: preprocessing.split.probabilities[2]; held out, never trained");
  w.End();
  WriteGeneration(w, c.generation);
  WriteOutput(w, c);
  w.raw() << YAML::EndMap;
  return std::string(w.raw().c_str()) + "\n";
}

}  // namespace qlora
