// ParseJobConfig: reads each section of the job file into JobConfig, then applies the rules that
// span sections, then (check_paths) resolves the dataset and model paths. Defaults are the
// JobConfig member initializers plus the choices made here (the ZeRO stage via
// zero_stage_policy.h, target_modules, features).
#include "common/config/job_config_parser.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/hf_dataset_folder.h"
#include "common/config/hf_model_path.h"
#include "common/config/job_config_schema.h"
#include "common/config/ludwig_sections.h"
#include "common/text/utf8.h"
#include "common/config/yaml_stream_shape.h"
#include "common/config/yaml_map_reader.h"
#include "common/config/zero_stage_policy.h"
#include "common/status_macros.h"
#include "yaml-cpp/depthguard.h"
#include "yaml-cpp/yaml.h"

namespace qlora {
namespace {

using config_internal::Bound;
using config_internal::Describe;
using config_internal::DecodeNumber;
using config_internal::ErrorSite;
using config_internal::IsPlainScalar;
using config_internal::JobFileSchema;
using config_internal::LevenshteinDistance;
using config_internal::LineOf;
using config_internal::MapReader;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int kIntMax = std::numeric_limits<int>::max();

// The linear layers of a LLaMA decoder block, in model order ("all-linear" expands to these).
const std::vector<std::string>& LlamaLinearModules() {
  static const auto* const kModules = new std::vector<std::string>{
      "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return *kModules;
}

// Things the parser learns besides the config itself, for the rules that span sections.
struct Presence {
  bool adapter = false;
  bool quantization_written = false;
  bool validation_fraction = false;
  bool split = false;  // preprocessing.split set the split fractions
  bool features = false;  // input_features or output_features written
};

// Ludwig allows `auto` for some sizes; this service needs numbers.
absl::Status RejectAuto(const MapReader& map, const std::string& key, const std::string& want) {
  const YAML::Node value = map.Get(key);
  if (value.IsDefined() && value.IsScalar() && value.Scalar() == "auto") {
    return map.Error(key, absl::StrCat("'auto' is not supported; give ", want));
  }
  return absl::OkStatus();
}

absl::Status ReadFeatures(const MapReader& top, const std::string& key,
                          std::vector<FeatureConfig>* out) {
  if (!top.Has(key)) return absl::OkStatus();  // keep the default
  const YAML::Node list = top.Get(key);
  if (!list.IsSequence() || list.size() == 0) {
    return top.Error(key, absl::StrCat("must be a non-empty list of {name, type} mappings, got ",
                                       list.IsSequence() ? "an empty list" : Describe(list)));
  }
  std::vector<FeatureConfig> features;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = absl::StrCat(key, "[", i, "]");
    QLORA_ASSIGN_OR_RETURN(MapReader feature,
                           MapReader::Open(top.site(), list[i], top.SchemaOf(key), path));
    if (!list[i].IsMap()) {
      return top.site()->Error(LineOf(list[i]), path,
                               absl::StrCat("must be a mapping {name, type}, got ",
                                            Describe(list[i])));
    }
    FeatureConfig f;
    QLORA_RETURN_IF_ERROR(feature.ReadString("name", &f.name));
    QLORA_RETURN_IF_ERROR(feature.ReadChoice("type", {"text"}, &f.type));
    if (f.name.empty()) return feature.Error("name", "missing; name the dataset column");
    if (!names.insert(f.name).second) {
      return feature.Error("name", absl::StrCat("feature '", f.name, "' is listed twice"));
    }
    features.push_back(f);
  }
  *out = std::move(features);
  return absl::OkStatus();
}

// A LLaMA module name, or the error for one that is not.
absl::Status CheckModuleName(ErrorSite* site, const YAML::Node& node, const std::string& path,
                             const std::string& name) {
  const std::vector<std::string>& known = LlamaLinearModules();
  for (const std::string& m : known) {
    if (name == m) return absl::OkStatus();
  }
  std::string closest = known.front();
  for (const std::string& m : known) {
    if (LevenshteinDistance(name, m) < LevenshteinDistance(name, closest)) closest = m;
  }
  return site->Error(LineOf(node), path,
                     absl::StrCat("unknown module '", name, "'; did you mean '", closest,
                                  "'? (LLaMA linear layers: ", absl::StrJoin(known, ", "),
                                  ", or all-linear)"));
}

absl::Status ReadTargetModules(const MapReader& adapter, std::vector<std::string>* out) {
  const std::string key = "target_modules";
  const std::string path = adapter.PathOf(key);
  if (!adapter.Has(key)) return absl::OkStatus();
  const YAML::Node value = adapter.Get(key);
  std::vector<std::pair<YAML::Node, std::string>> names;
  if (value.IsScalar()) {
    names.emplace_back(value, value.Scalar());
  } else if (value.IsSequence()) {
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) {
        return adapter.site()->Error(LineOf(item), path,
                                     absl::StrCat("entries must be module names, got ",
                                                  Describe(item)));
      }
      names.emplace_back(item, item.Scalar());
    }
  } else {
    return adapter.Error(key, absl::StrCat("must be a list of module names or \"all-linear\", "
                                           "got ", Describe(value)));
  }
  if (names.empty()) {
    return adapter.Error(key, "must name at least one module (or \"all-linear\")");
  }
  std::vector<std::string> modules;
  for (const auto& [node, name] : names) {
    if (name == "all-linear") {
      if (names.size() != 1) {
        return adapter.site()->Error(LineOf(node), path,
                                     "\"all-linear\" must be the only entry");
      }
      *out = LlamaLinearModules();
      return absl::OkStatus();
    }
    QLORA_RETURN_IF_ERROR(CheckModuleName(adapter.site(), node, path, name));
    for (const std::string& seen : modules) {
      if (seen == name) {
        return adapter.site()->Error(LineOf(node), path,
                                     absl::StrCat("module '", name, "' is listed twice"));
      }
    }
    modules.push_back(name);
  }
  *out = std::move(modules);
  return absl::OkStatus();
}

absl::Status ReadAdapter(const MapReader& top, JobConfig* c, Presence* presence) {
  presence->adapter = top.Has("adapter");
  if (!presence->adapter) return absl::OkStatus();
  QLORA_ASSIGN_OR_RETURN(MapReader adapter, top.OpenMap("adapter"));
  LoraConfig& lora = c->lora;
  QLORA_RETURN_IF_ERROR(adapter.ReadChoice("type", {"lora"}, &c->adapter_type));
  QLORA_RETURN_IF_ERROR(adapter.ReadInt("r", 1, kIntMax, &lora.r));
  QLORA_RETURN_IF_ERROR(adapter.ReadNumber("alpha", {0, false}, {kInf, true}, &lora.alpha));
  QLORA_RETURN_IF_ERROR(adapter.ReadNumber("dropout", {0, true}, {1, false}, &lora.dropout));
  QLORA_RETURN_IF_ERROR(ReadTargetModules(adapter, &lora.target_modules));
  QLORA_RETURN_IF_ERROR(adapter.ReadBool("use_rslora", &lora.use_rslora));
  QLORA_RETURN_IF_ERROR(adapter.ReadString("pretrained_adapter_weights", &lora.pretrained_adapter_path));
  std::string bias_type = "none";
  QLORA_RETURN_IF_ERROR(adapter.ReadChoice("bias_type", {"none"}, &bias_type));
  QLORA_ASSIGN_OR_RETURN(MapReader post, adapter.OpenMap("postprocessor"));
  QLORA_RETURN_IF_ERROR(
      post.ReadBool("merge_adapter_into_base_model", &lora.merge_adapter_into_base_model));
  bool progressbar = false;  // accepted for compatibility; the service logs progress anyway
  QLORA_RETURN_IF_ERROR(post.ReadBool("progressbar", &progressbar));
  return absl::OkStatus();
}

absl::Status ReadQuantization(const MapReader& top, QuantizationConfig* q) {
  const YAML::Node node = top.Get("quantization");
  if (node.IsDefined() && node.IsNull()) {  // `quantization: null` turns it off
    q->enabled = false;
    return absl::OkStatus();
  }
  QLORA_ASSIGN_OR_RETURN(MapReader quant, top.OpenMap("quantization"));
  QLORA_RETURN_IF_ERROR(quant.ReadInt("bits", 1, 64, &q->bits));
  if (q->bits == 8) {
    return quant.Error("bits", "8-bit quantization is not supported; use bits: 4");
  }
  if (q->bits != 4) {
    return quant.Error("bits", absl::StrCat("must be 4 (4-bit NF4/FP4), got ", q->bits));
  }
  QLORA_RETURN_IF_ERROR(quant.ReadEnum("bnb_4bit_quant_type", &q->quant_type));
  QLORA_RETURN_IF_ERROR(quant.ReadBool("bnb_4bit_use_double_quant", &q->double_quant));
  QLORA_RETURN_IF_ERROR(quant.ReadEnum("bnb_4bit_compute_dtype", &q->compute_dtype));
  QLORA_RETURN_IF_ERROR(quant.ReadInt("blocksize", 1, kIntMax, &q->blocksize));
  QLORA_RETURN_IF_ERROR(quant.ReadBool("float8_base_forward", &q->float8_base_forward));
  if (q->float8_base_forward && q->compute_dtype != ComputeDtype::kBFloat16) {
    return quant.Error("float8_base_forward",
                       absl::StrCat("needs bnb_4bit_compute_dtype: bfloat16 (the FP8 GEMMs write "
                                    "bfloat16), got ", EnumName(q->compute_dtype)));
  }
  const int b = q->blocksize;
  if (b < 32 || b > 4096 || (b & (b - 1)) != 0) {
    return quant.Error("blocksize",
                       absl::StrCat("must be a power of two between 32 and 4096, got ", b));
  }
  return absl::OkStatus();
}

// fp16: {enabled: ...} / bf16: {enabled: ...}; "auto" means off, as DeepSpeed drops auto keys.
absl::Status ReadPrecisionSwitch(const MapReader& strategy, const std::string& key,
                                 bool* enabled) {
  QLORA_ASSIGN_OR_RETURN(MapReader section, strategy.OpenMap(key));
  const YAML::Node value = section.Get("enabled");
  if (value.IsDefined() && value.IsScalar() && value.Scalar() == "auto") return absl::OkStatus();
  return section.ReadBool("enabled", enabled);
}

// An integer >= 0 (floats such as 1e9 too, as DeepSpeed's JSON allows), or a bool for the
// _on_model_save key.
bool IsDeepSpeedKnobValue(const std::string& key, const YAML::Node& value) {
  const std::string& text = value.Scalar();
  if (absl::EndsWith(key, "_on_model_save")) return text == "true" || text == "false";
  double number = 0;
  return absl::SimpleAtod(text, &number) && number >= 0 && number < 1e18;
}

// DeepSpeed's offload_param / offload_optimizer: {device: cpu|none, pin_memory, and tuning keys
// accepted with no effect: integers `knobs`, bools `switches`}; nvme is refused for
// `why_not_nvme`. Absent or null: off.
struct OffloadSection {
  const char* key;
  std::vector<const char*> knobs;
  std::vector<const char*> switches;
  const char* why_not_nvme;
};
absl::Status ReadOffload(const MapReader& zero, const OffloadSection& section, bool* on_cpu,
                         bool* pin_memory) {
  if (!zero.Has(section.key) || zero.Get(section.key).IsNull()) return absl::OkStatus();
  QLORA_ASSIGN_OR_RETURN(MapReader offload, zero.OpenMap(section.key));
  std::string device = "none";
  QLORA_RETURN_IF_ERROR(offload.ReadString("device", &device));
  if (device == "nvme") {
    return offload.Error("device", absl::StrCat("nvme is not built: ", section.why_not_nvme,
                                                "; use device: cpu"));
  }
  if (device != "cpu" && device != "none") {
    return offload.Error("device", absl::StrCat("must be cpu or none, got \"", device, "\""));
  }
  *on_cpu = device == "cpu";
  QLORA_RETURN_IF_ERROR(offload.ReadBool("pin_memory", pin_memory));
  for (const char* key : section.knobs) {
    if (offload.Has(key) && !(offload.Get(key).IsScalar() &&
                              IsDeepSpeedKnobValue(key, offload.Get(key)))) {
      return offload.Error(key, "must be an integer >= 0");
    }
  }
  for (const char* key : section.switches) {
    bool ignored = false;
    QLORA_RETURN_IF_ERROR(offload.ReadBool(key, &ignored));
  }
  return absl::OkStatus();
}

absl::Status ReadOffloads(const MapReader& zero, StrategyConfig* s) {
  QLORA_RETURN_IF_ERROR(ReadOffload(
      zero,
      {"offload_param", {"buffer_count", "buffer_size", "max_in_cpu"}, {},
       "the 4-bit weights of a 70B model (36 GB) fit host memory"},
      &s->offload_param, &s->offload_param_pin_memory));
  return ReadOffload(
      zero,
      {"offload_optimizer", {"buffer_count"}, {"fast_init"},
       "the AdamW moments of LoRA adapters (1.7 GB at 70B, r=16) fit host memory"},
      &s->offload_optimizer, &s->offload_optimizer_pin_memory);
}

absl::Status ReadZeroOptimization(const MapReader& strategy, StrategyConfig* s,
                                  std::optional<int>* written_stage, bool* written_auto) {
  QLORA_ASSIGN_OR_RETURN(MapReader zero, strategy.OpenMap("zero_optimization"));
  const YAML::Node stage = zero.Get("stage");
  if (stage.IsDefined() && stage.IsScalar() && stage.Scalar() == "auto") {
    *written_auto = true;
  } else if (zero.Has("stage")) {
    int value = 0;
    QLORA_RETURN_IF_ERROR(zero.ReadInt("stage", 0, 3, &value));
    *written_stage = value;
  }
  QLORA_RETURN_IF_ERROR(zero.ReadInt("reduce_bucket_size", 1, kInt64Max, &s->reduce_bucket_size));
  QLORA_RETURN_IF_ERROR(
      zero.ReadInt("allgather_bucket_size", 1, kInt64Max, &s->allgather_bucket_size));
  if (s->allgather_bucket_size % 2 != 0) {
    return zero.Error("allgather_bucket_size",
                      absl::StrCat("must be even (DeepSpeed aligns partitions to 2 elements), "
                                   "got ", s->allgather_bucket_size));
  }
  QLORA_RETURN_IF_ERROR(zero.ReadBool("overlap_comm", &s->overlap_comm));
  QLORA_RETURN_IF_ERROR(zero.ReadBool("contiguous_gradients", &s->contiguous_gradients));
  QLORA_RETURN_IF_ERROR(ReadOffloads(zero, s));
  // DeepSpeed's stage-3 tuning keys: checked (an integer, a bool, or "auto" as the HF
  // integration writes them) and kept to be shown; they change nothing (the schema says why).
  for (const char* key : {"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                          "stage3_max_live_parameters", "stage3_max_reuse_distance",
                          "stage3_gather_16bit_weights_on_model_save"}) {
    if (!zero.Has(key)) continue;
    const YAML::Node value = zero.Get(key);
    if (!value.IsScalar() || !(value.Scalar() == "auto" || IsDeepSpeedKnobValue(key, value))) {
      return zero.Error(key, absl::StrCat(
          "must be ", absl::EndsWith(key, "_on_model_save") ? "true, false" : "an integer >= 0",
          " or auto"));
    }
    s->stage3_knobs.emplace_back(key, value.Scalar());
  }
  return absl::OkStatus();
}

absl::Status ReadStrategy(const MapReader& backend_trainer, const QuantizationConfig& quant,
                          StrategyConfig* s) {
  const std::string key = "strategy";
  std::optional<int> written_stage;
  bool written_auto = false;
  bool reason_written = false;
  std::string written_reason;
  std::string stage_key_path = absl::StrCat(backend_trainer.PathOf(key), ".zero_optimization");
  bool fp16 = false;
  bool bf16 = false;
  std::optional<MapReader> strategy;
  if (backend_trainer.Has(key) && backend_trainer.Get(key).IsScalar()) {
    QLORA_RETURN_IF_ERROR(backend_trainer.ReadEnum(key, &s->type));
  } else {
    QLORA_ASSIGN_OR_RETURN(strategy, backend_trainer.OpenMap(key));
    QLORA_RETURN_IF_ERROR(strategy->ReadEnum("type", &s->type));
    if (s->type == StrategyType::kDdp) {
      for (const char* deepspeed_only : {"zero_optimization", "fp16", "bf16"}) {
        if (strategy->Has(deepspeed_only)) {
          return strategy->Error(deepspeed_only, "only applies to strategy type deepspeed");
        }
      }
    }
    QLORA_RETURN_IF_ERROR(ReadZeroOptimization(*strategy, s, &written_stage, &written_auto));
    QLORA_RETURN_IF_ERROR(ReadPrecisionSwitch(*strategy, "fp16", &fp16));
    QLORA_RETURN_IF_ERROR(ReadPrecisionSwitch(*strategy, "bf16", &bf16));
    reason_written = strategy->Has("zero_stage_reason");
    QLORA_RETURN_IF_ERROR(strategy->ReadString("zero_stage_reason", &written_reason));
  }
  absl::StatusOr<ZeroStageChoice> choice =
      ChooseZeroStage(s->type, written_stage, written_auto, quant.enabled, s->offload_param);
  if (!choice.ok()) {
    ErrorSite* site = backend_trainer.site();
    const std::string stage_path = absl::StrCat(stage_key_path, ".stage");
    return site->Error(site->Line(stage_path), stage_path, std::string(choice.status().message()));
  }
  s->zero_stage = choice->stage;
  s->zero_stage_reason = reason_written ? written_reason : choice->reason;
  s->zero_stage_auto = choice->automatic;

  if (fp16 && bf16) {
    return strategy->Error("bf16", "fp16 and bf16 cannot both be enabled (DeepSpeed refuses "
                                   "this too); the compute dtype is "
                                   "quantization.bnb_4bit_compute_dtype");
  }
  const ComputeDtype wanted = fp16 ? ComputeDtype::kFloat16
                               : bf16 ? ComputeDtype::kBFloat16
                                      : quant.compute_dtype;
  if (wanted != quant.compute_dtype) {
    const std::string which = fp16 ? "fp16" : "bf16";
    return strategy->Error(
        which, absl::StrCat(which, " is enabled but quantization.bnb_4bit_compute_dtype is ",
                            EnumName(quant.compute_dtype), "; the compute dtype is set there "
                            "alone: set bnb_4bit_compute_dtype: ", EnumName(wanted),
                            " (or remove ", which, ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadBackend(const MapReader& top, const QuantizationConfig& quant,
                         BackendConfig* b) {
  QLORA_ASSIGN_OR_RETURN(MapReader backend, top.OpenMap("backend"));
  const YAML::Node type = backend.Get("type");
  if (type.IsDefined() && type.IsScalar() && type.Scalar() == "deepspeed") {
    return backend.Error("type", "backend type 'deepspeed' is not supported; use `type: ray` "
                                 "(or local) with `trainer: {strategy: deepspeed}`");
  }
  QLORA_RETURN_IF_ERROR(backend.ReadEnum("type", &b->type));
  QLORA_ASSIGN_OR_RETURN(MapReader trainer, backend.OpenMap("trainer"));
  QLORA_RETURN_IF_ERROR(trainer.ReadBool("use_gpu", &b->use_gpu));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("num_workers", 0, kIntMax, &b->num_workers));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("min_workers", 0, kIntMax, &b->min_workers));
  if (b->min_workers > 0 && b->num_workers > 0 && b->min_workers > b->num_workers) {
    return trainer.Error("min_workers", absl::StrCat("min_workers (", b->min_workers, ") is more than num_workers (",
                                                     b->num_workers, ")"));
  }
  QLORA_RETURN_IF_ERROR(trainer.ReadEnum("placement_strategy", &b->placement));
  QLORA_ASSIGN_OR_RETURN(MapReader resources, trainer.OpenMap("resources_per_worker"));
  QLORA_RETURN_IF_ERROR(resources.ReadInt("CPU", 1, 1024, &b->cpus_per_worker));
  int gpus = b->use_gpu ? 1 : 0;
  QLORA_RETURN_IF_ERROR(resources.ReadInt("GPU", 0, 1, &gpus));
  if (gpus != (b->use_gpu ? 1 : 0)) {
    return resources.Error("GPU", absl::StrCat("a worker uses exactly one GPU with use_gpu: true and none "
                                               "with use_gpu: false; got GPU: ", gpus, " with use_gpu: ",
                                               b->use_gpu ? "true" : "false"));
  }
  return ReadStrategy(trainer, quant, &b->strategy);
}

// Why `name` cannot name a job ("" when it can): it is shown in terminals and tables, so no
// control characters (C0, DEL, C1: terminal escapes could forge rows), no bidirectional
// formatting characters (U+061C, U+200E-F, U+202A-E, U+2066-9: a name would show reversed, or
// reorder the columns after it) nor line and paragraph separators (U+2028-9), and at most 128
// bytes.
// Whether `text` starts with one of the formatting characters JobNameProblem refuses.
bool IsLayoutControl(std::string_view text) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  if (text.size() >= 2 && at(0) == 0xD8 && at(1) == 0x9C) return true;  // U+061C
  if (text.size() < 3 || at(0) != 0xE2) return false;
  if (at(1) == 0x80) {
    const unsigned char c = at(2);
    return c == 0x8E || c == 0x8F || (c >= 0xA8 && c <= 0xAE);  // U+200E-F, U+2028-E
  }
  return at(1) == 0x81 && at(2) >= 0xA6 && at(2) <= 0xA9;  // U+2066-9
}

std::string JobNameProblem(const std::string& name) {
  constexpr size_t kMaxNameBytes = 128;
  if (name.size() > kMaxNameBytes) {
    return absl::StrCat("at most ", kMaxNameBytes, " bytes, got ", name.size());
  }
  if (const size_t bad = FirstInvalidUtf8(name); bad != std::string::npos) {
    return absl::StrCat("not valid UTF-8 at byte ", bad);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool c1 = c == 0xC2 && i + 1 < name.size() &&
                    static_cast<unsigned char>(name[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(name[i + 1]) <= 0x9F;
    if (c < 0x20 || c == 0x7F || c1) {
      return absl::StrCat("control character at byte ", i, " (names must be printable)");
    }
    if (IsLayoutControl(std::string_view(name).substr(i))) {
      return absl::StrCat("bidirectional or line-layout control character at byte ", i,
                          " (names must show as written)");
    }
  }
  return "";
}

absl::Status ReadOptimizerType(const MapReader& map, const std::string& key,
                               OptimizerType* out) {
  std::string type = EnumName(*out);
  QLORA_RETURN_IF_ERROR(map.ReadString(key, &type));
  if (std::optional<OptimizerType> known = ParseEnumName<OptimizerType>(type)) {
    *out = *known;
    return absl::OkStatus();
  }
  if (absl::StartsWith(type, "paged_") || absl::StrContains(type, "8bit")) {
    return map.Error(key, absl::StrCat("optimizer '", type, "': paged and 8-bit optimizers are "
                                       "not supported (DeepSpeed refuses them too); use adamw"));
  }
  return map.Error(key, absl::StrCat("must be one of adamw, adam; got '", type, "'"));
}

absl::Status ReadBetas(const MapReader& optimizer, TrainerConfig* t) {
  if (!optimizer.Has("betas")) return absl::OkStatus();
  const YAML::Node betas = optimizer.Get("betas");
  const std::string problem = "must be a list of two numbers in [0, 1), e.g. [0.9, 0.999]";
  if (!betas.IsSequence() || betas.size() != 2) {
    return optimizer.Error("betas", absl::StrCat(problem, "; got ", Describe(betas)));
  }
  double values[2];
  for (size_t i = 0; i < 2; ++i) {
    if (!DecodeNumber(betas[i], &values[i]) || values[i] < 0 || values[i] >= 1) {
      return optimizer.site()->Error(LineOf(betas[i]), optimizer.PathOf("betas"),
                                     absl::StrCat(problem, "; got ", Describe(betas[i])));
    }
  }
  t->beta1 = values[0];
  t->beta2 = values[1];
  return absl::OkStatus();
}

absl::Status ReadOptimizer(const MapReader& trainer, TrainerConfig* t) {
  const std::string key = "optimizer";
  if (trainer.Has(key) && trainer.Get(key).IsScalar()) {
    return ReadOptimizerType(trainer, key, &t->optimizer);
  }
  QLORA_ASSIGN_OR_RETURN(MapReader optimizer, trainer.OpenMap(key));
  QLORA_RETURN_IF_ERROR(ReadOptimizerType(optimizer, "type", &t->optimizer));
  QLORA_RETURN_IF_ERROR(
      optimizer.ReadNumber("weight_decay", {0, true}, {kInf, true}, &t->weight_decay));
  QLORA_RETURN_IF_ERROR(ReadBetas(optimizer, t));
  return optimizer.ReadNumber("eps", {0, false}, {1, true}, &t->eps);
}

absl::Status ReadScheduler(const MapReader& trainer, TrainerConfig* t) {
  QLORA_ASSIGN_OR_RETURN(MapReader scheduler, trainer.OpenMap("learning_rate_scheduler"));
  const YAML::Node decay = scheduler.Get("decay");
  if (decay.IsDefined() && decay.IsNull()) {
    t->lr_scheduler = LrScheduler::kConstant;
  } else {
    QLORA_RETURN_IF_ERROR(scheduler.ReadEnum("decay", &t->lr_scheduler));
  }
  return scheduler.ReadNumber("warmup_fraction", {0, true}, {1, true}, &t->warmup_fraction);
}

// A count of layers (an integer >= 0) or `auto` at `key`: *automatic, else *count.
absl::Status ReadLayersOrAuto(const MapReader& trainer, const std::string& key, int64_t* count,
                              bool* automatic) {
  const YAML::Node value = trainer.Get(key);
  if (trainer.Has(key) && IsPlainScalar(value) && value.Scalar() == "auto") {
    *automatic = true;
    return absl::OkStatus();
  }
  if (!trainer.ReadInt(key, 0, kIntMax, count).ok()) {
    return trainer.Error(key, absl::StrCat("must be a number of layers (an integer >= 0) or auto, "
                                           "got ", Describe(value)));
  }
  return absl::OkStatus();
}

// enable_gradient_checkpointing: a boolean or `auto`; max_memory_gib: the budget auto plans for,
// refused where nothing plans by it (checkpointing true or false without dequantized_weight_layers:
// auto and with a written ZeRO stage, so a budget there would be silently unused).
absl::Status ReadCheckpointing(const MapReader& trainer, TrainerConfig* t, bool stage_planned) {
  const std::string key = "enable_gradient_checkpointing";
  const YAML::Node value = trainer.Get(key);
  if (trainer.Has(key) && IsPlainScalar(value) && value.Scalar() == "auto") {
    t->gradient_checkpointing = CheckpointingMode::kAuto;
  } else if (trainer.Has(key)) {
    bool on = true;
    if (!IsPlainScalar(value) || !YAML::convert<bool>::decode(value, on)) {
      return trainer.Error(key, absl::StrCat("must be true, false or auto, got ", Describe(value)));
    }
    t->gradient_checkpointing = on ? CheckpointingMode::kAll : CheckpointingMode::kNone;
  }
  QLORA_RETURN_IF_ERROR(ReadLayersOrAuto(trainer, "offload_activation_layers",
                                         &t->offload_activation_layers,
                                         &t->offload_activation_auto));
  QLORA_RETURN_IF_ERROR(ReadLayersOrAuto(trainer, "dequantized_weight_layers",
                                         &t->dequantized_weight_layers,
                                         &t->dequantized_weights_auto));
  QLORA_RETURN_IF_ERROR(
      trainer.ReadNumber("max_memory_gib", {0, false}, {1e6, true}, &t->max_memory_gib));
  // With checkpointing true the budget sizes the MLP tiles of long rows and caps what
  // offload_activation_layers: auto offloads; with none of these nothing plans by it.
  if (trainer.Has("max_memory_gib") && t->gradient_checkpointing == CheckpointingMode::kNone &&
      !t->dequantized_weights_auto && !stage_planned) {
    return trainer.Error("max_memory_gib",
                         absl::StrCat("applies only with enable_gradient_checkpointing: true or "
                                      "auto (it is ", EnumName(t->gradient_checkpointing),
                                      "), dequantized_weight_layers: auto or a ZeRO stage left "
                                      "to the service (stage: auto); set one or remove "
                                      "max_memory_gib"));
  }
  QLORA_RETURN_IF_ERROR(
      trainer.ReadNumber("max_host_memory_gib", {0, false}, {1e6, true}, &t->max_host_memory_gib));
  if (trainer.Has("max_host_memory_gib") && !t->offload_activation_auto) {
    return trainer.Error("max_host_memory_gib",
                         "applies only with offload_activation_layers: auto (a written count "
                         "pins what its layers save whatever the budget); set it to auto or "
                         "remove max_host_memory_gib");
  }
  return absl::OkStatus();
}

// report_to: a name or a list of them, as HF's TrainingArguments takes it.
absl::Status ReadReportTo(const MapReader& trainer, bool* mlflow) {
  const std::string key = "report_to";
  if (!trainer.Has(key)) return absl::OkStatus();
  const YAML::Node value = trainer.Get(key);
  std::vector<YAML::Node> items;
  if (value.IsScalar()) items.push_back(value);
  if (value.IsSequence()) {
    for (const YAML::Node& item : value) items.push_back(item);
  }
  if (!value.IsScalar() && !value.IsSequence()) {
    return trainer.Error(key, absl::StrCat("must be a name or a list of names, got ", Describe(value)));
  }
  for (const YAML::Node& item : items) {
    const std::string name = item.IsScalar() ? absl::AsciiStrToLower(item.Scalar()) : "";
    if (name == "tensorboard" || name == "none") continue;  // TensorBoard files are always written
    if (name == "mlflow") {
      *mlflow = true;
      continue;
    }
    std::string why = "only tensorboard (always on) and mlflow are supported";
    if (name == "wandb") {
      why = "Weights & Biases is not supported: its server cannot run beside the tests that "
            "would prove this service talks to it correctly; use mlflow (MLFLOW_TRACKING_URI) "
            "or the TensorBoard files in <output_dir>/runs";
    } else if (name == "all") {
      why = "name the trackers: tensorboard (always on) and mlflow";
    }
    return trainer.site()->Error(LineOf(item), trainer.PathOf(key),
                                 absl::StrCat("'", item.IsScalar() ? item.Scalar() : Describe(item), "': ", why));
  }
  return absl::OkStatus();
}

// TRL's preference knobs: beta for dpo and orpo; loss_type and label_smoothing for dpo (TRL's
// ORPOConfig has neither); each refused where it would have no effect.
absl::Status ReadPreference(const MapReader& trainer, TrainerConfig* t) {
  const bool preference = t->type == TrainerType::kDpo || t->type == TrainerType::kOrpo;
  for (const char* key : {"beta", "loss_type", "label_smoothing"}) {
    if (trainer.Has(key) && !preference) {
      return trainer.Error(key, absl::StrCat("applies to preference tuning only (trainer.type dpo "
                                             "or orpo); this job's type is ", EnumName(t->type)));
    }
  }
  for (const char* key : {"loss_type", "label_smoothing"}) {
    if (trainer.Has(key) && t->type == TrainerType::kOrpo) {
      return trainer.Error(key, "is DPO's; ORPO's only knob is beta (its lambda)");
    }
  }
  QLORA_RETURN_IF_ERROR(trainer.ReadNumber("beta", {0, false}, {1e4, true}, &t->beta));
  QLORA_RETURN_IF_ERROR(trainer.ReadEnum("loss_type", &t->loss_type));
  // Robust DPO: the assumed probability that a pair's labels are flipped (TRL's bound).
  QLORA_RETURN_IF_ERROR(
      trainer.ReadNumber("label_smoothing", {0, true}, {0.5, false}, &t->label_smoothing));
  if (t->label_smoothing > 0 && t->loss_type != PreferenceLoss::kRobust) {
    return trainer.Error("label_smoothing", absl::StrCat(
        "applies to loss_type robust only; ", EnumName(t->loss_type),
        " ignores it, as TRL's does: use loss_type robust, or remove it"));
  }
  return absl::OkStatus();
}

absl::Status ReadTrainer(const MapReader& top, bool stage_planned, TrainerConfig* t) {
  QLORA_ASSIGN_OR_RETURN(MapReader trainer, top.OpenMap("trainer"));
  QLORA_RETURN_IF_ERROR(trainer.ReadEnum("type", &t->type));
  QLORA_RETURN_IF_ERROR(ReadPreference(trainer, t));
  QLORA_RETURN_IF_ERROR(RejectAuto(trainer, "batch_size", "an integer >= 1"));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("batch_size", 1, kIntMax, &t->batch_size));
  QLORA_RETURN_IF_ERROR(RejectAuto(trainer, "eval_batch_size", "an integer >= 1"));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("eval_batch_size", 1, kIntMax, &t->eval_batch_size));
  QLORA_RETURN_IF_ERROR(RejectAuto(trainer, "gradient_accumulation_steps", "an integer >= 1"));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("gradient_accumulation_steps", 1, kIntMax,
                                        &t->gradient_accumulation_steps));
  QLORA_RETURN_IF_ERROR(RejectAuto(trainer, "learning_rate", "a number > 0 and <= 1"));
  QLORA_RETURN_IF_ERROR(
      trainer.ReadNumber("learning_rate", {0, false}, {1, true}, &t->learning_rate));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("epochs", 0, kIntMax, &t->epochs));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("train_steps", 0, kInt64Max, &t->train_steps));
  if (t->epochs < 1 && t->train_steps == 0) {
    return trainer.Error("epochs", absl::StrCat("must be >= 1 unless trainer.train_steps > 0, "
                                                "got ", t->epochs));
  }
  QLORA_RETURN_IF_ERROR(ReadOptimizer(trainer, t));
  QLORA_RETURN_IF_ERROR(ReadScheduler(trainer, t));
  QLORA_ASSIGN_OR_RETURN(MapReader clipping, trainer.OpenMap("gradient_clipping"));
  const YAML::Node norm = clipping.Get("clipglobalnorm");
  if (norm.IsDefined() && norm.IsNull()) t->max_grad_norm = 0;  // null: no clipping
  QLORA_RETURN_IF_ERROR(
      clipping.ReadNumber("clipglobalnorm", {0, true}, {kInf, true}, &t->max_grad_norm));
  QLORA_RETURN_IF_ERROR(ReadCheckpointing(trainer, t, stage_planned));
  QLORA_RETURN_IF_ERROR(
      trainer.ReadInt("steps_per_checkpoint", 0, kInt64Max, &t->steps_per_checkpoint));
  QLORA_RETURN_IF_ERROR(
      trainer.ReadNumber("checkpoint_every_minutes", {0, true}, {1e6, true}, &t->checkpoint_every_minutes));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("eval_steps", 0, kInt64Max, &t->eval_steps));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("eval_samples", 0, 64, &t->eval_samples));
  if (trainer.Has("eval_prompts")) {
    const YAML::Node prompts = trainer.Get("eval_prompts");
    if (!prompts.IsSequence()) return trainer.Error("eval_prompts", "must be a list of prompts");
    for (const YAML::Node& prompt : prompts) {
      if (!prompt.IsScalar() || prompt.Scalar().empty()) {
        return trainer.Error("eval_prompts", "each entry must be a non-empty prompt");
      }
      t->eval_prompts.push_back(prompt.Scalar());
    }
    if (t->eval_prompts.size() > 64) return trainer.Error("eval_prompts", "at most 64 prompts");
  }
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("max_restarts", 0, 100, &t->max_restarts));
  QLORA_RETURN_IF_ERROR(trainer.ReadInt("keep_checkpoints", 0, kInt64Max, &t->keep_checkpoints));
  QLORA_RETURN_IF_ERROR(trainer.ReadString("resume_from_checkpoint", &t->resume_from_checkpoint));
  QLORA_RETURN_IF_ERROR(ReadReportTo(trainer, &t->report_to_mlflow));
  return trainer.ReadUint("seed", &t->seed);
}

absl::Status ReadData(const MapReader& top, DataConfig* d, Presence* presence) {
  QLORA_ASSIGN_OR_RETURN(MapReader data, top.OpenMap("data"));
  QLORA_RETURN_IF_ERROR(data.ReadEnum("format", &d->format));
  QLORA_RETURN_IF_ERROR(data.ReadString("prompt_template", &d->prompt_template));
  QLORA_RETURN_IF_ERROR(
      data.ReadInt("max_sequence_length", 8, config_internal::kMaxSequenceLength,
                   &d->max_sequence_length));
  QLORA_RETURN_IF_ERROR(data.ReadBool("packing", &d->packing));
  QLORA_RETURN_IF_ERROR(data.ReadEnum("malformed_records", &d->malformed_records));
  QLORA_RETURN_IF_ERROR(data.ReadNumber("max_without_target_fraction", {0, true}, {1, true},
                                        &d->max_without_target_fraction));
  presence->validation_fraction = data.Has("validation_fraction");
  QLORA_RETURN_IF_ERROR(
      data.ReadNumber("validation_fraction", {0, true}, {1, false}, &d->validation_fraction));
  return data.ReadNumber("test_fraction", {0, true}, {1, false}, &d->test_fraction);
}

// The rules that span sections (Ludwig's config checks, restated for this service).
absl::Status CheckCrossFieldRules(const ErrorSite& site, const JobConfig& c,
                                  const Presence& presence) {
  if (!presence.adapter) {
    if (presence.quantization_written && c.quantization.enabled) {
      return site.ErrorAt(
          "quantization",
          "4-bit quantization requires a LoRA adapter (the quantized base weights are frozen "
          "and only the adapter trains): add `adapter: {type: lora}`");
    }
    return site.Error(0, "adapter", "missing; this service trains LoRA adapters (on a 4-bit "
                                    "base unless `quantization: null`): add "
                                    "`adapter: {type: lora}`");
  }
  if (c.trainer.type == TrainerType::kNone) {
    return site.ErrorAt("trainer.type", "adapter training requires trainer type finetune, dpo "
                                        "or orpo, got 'none'");
  }
  const bool preference = c.trainer.type != TrainerType::kFinetune;
  if (preference && c.data.packing) {
    return site.ErrorAt("data.packing", "preference tuning reads each pair's chosen and rejected "
                                        "sequences as rows of their own; packing is for "
                                        "finetune: remove it");
  }
  if (preference && (c.input_features.size() != 1 || c.output_features.size() != 2)) {
    return site.ErrorAt(
        c.input_features.size() != 1 ? "input_features" : "output_features",
        absl::StrCat("a ", EnumName(c.trainer.type), " job reads a prompt column (the one input "
                     "feature) and the chosen and rejected columns (the two output features, in "
                     "that order); leave both out for TRL's prompt, chosen and rejected, got ",
                     c.input_features.size(), " input and ", c.output_features.size(),
                     " output features"));
  }
  if (preference) {
    std::set<std::string> names;
    for (const FeatureConfig& f : c.input_features) names.insert(f.name);
    for (const FeatureConfig& f : c.output_features) {
      if (!names.insert(f.name).second) {
        return site.ErrorAt("output_features", absl::StrCat("'", f.name, "' is named twice; the "
                                                            "prompt, chosen and rejected columns "
                                                            "must differ"));
      }
    }
  }
  if (!preference && c.output_features.size() != 1) {
    return site.ErrorAt("output_features",
                        absl::StrCat("must list exactly one text output, got ",
                                     c.output_features.size()));
  }
  for (const FeatureConfig& in : c.input_features) {
    if (in.name == c.output_features[0].name) {
      return site.ErrorAt("output_features",
                          absl::StrCat("'", in.name, "' is both an input and the output"));
    }
  }
  const char* validation_key =
      presence.split ? "preprocessing.split.probabilities" : "data.validation_fraction";
  if (!c.data.validation_path.empty() && (presence.validation_fraction || presence.split) &&
      c.data.validation_fraction > 0) {
    return site.ErrorAt(validation_key,
                        "a validation share cannot be used together with validation_dataset; "
                        "give one of them");
  }
  if (c.data.validation_fraction + c.data.test_fraction >= 1) {
    return site.ErrorAt(presence.split ? validation_key : "data.test_fraction",
                        "the validation and test shares leave nothing to train on");
  }
  return absl::OkStatus();
}

absl::Status StatusWithCode(absl::StatusCode code, const absl::Status& formatted) {
  return absl::Status(code, formatted.message());
}

// check_paths: datasets must exist (made absolute); base_model resolves to a local folder.
absl::Status ResolvePaths(const ErrorSite& site, const ParseOptions& options,
                          bool base_model_path_written, JobConfig* c) {
  namespace fs = std::filesystem;
  struct DatasetField {
    const char* key;
    bool overridden;
    std::string* path;
  };
  // A relative path means relative to options.base_dir (the client's folder) when one is given.
  auto from_base = [&](const std::string& path) -> fs::path {
    if (options.base_dir.empty() || fs::path(path).is_absolute()) return fs::path(path);
    return fs::path(options.base_dir) / path;
  };
  if (!c->output_dir.empty()) {
    std::error_code ec;
    c->output_dir = fs::absolute(from_base(c->output_dir), ec).lexically_normal().string();
  }
  auto allowed = [&](absl::string_view field, const std::string& path) {
    return options.before_touching ? options.before_touching(field, path) : absl::OkStatus();
  };
  for (const DatasetField& field :
       {DatasetField{"dataset", !options.dataset_override.empty(), &c->data.train_path},
        DatasetField{"validation_dataset", !options.validation_dataset_override.empty(),
                     &c->data.validation_path}}) {
    if (field.path->empty()) continue;
    std::error_code ec;
    const fs::path absolute = fs::absolute(from_base(*field.path), ec).lexically_normal();
    QLORA_RETURN_IF_ERROR(allowed(field.key, absolute.string()));
    if (ec || !fs::exists(absolute, ec)) {
      const std::string where =
          field.overridden ? absl::StrCat(field.key, " (from the command line)") : field.key;
      // A hub dataset's name ("tatsu-lab/alpaca", no file extension): the service reads local
      // files only.
      const std::string remedy =
          LooksLikeHubRepoId(*field.path) && absl::StrContains(*field.path, "/") &&
                  !fs::path(*field.path).has_extension()
              ? absl::StrCat("; '", *field.path, "' looks like a Hugging Face hub dataset, which "
                             "the service does not download: fetch it with `hf download ",
                             *field.path, " --repo-type dataset --local-dir DIR` and name its "
                             ".parquet, .jsonl or .json files, or a folder that `datasets` saved")
              : "";
      return StatusWithCode(
          absl::StatusCode::kNotFound,
          site.Error(field.overridden ? 0 : site.Line(field.key), where,
                     absl::StrCat("file '", absolute.string(), "' does not exist", remedy)));
    }
    *field.path = absolute.string();
    if (fs::is_directory(absolute, ec)) {  // a folder that Hugging Face `datasets` wrote
      const DatasetRoleSplit role = std::string(field.key) == "dataset" ? DatasetRoleSplit::kTrain
                                                                        : DatasetRoleSplit::kValidation;
      absl::StatusOr<std::string> files = HfDatasetFolderFiles(absolute.string(), role);
      if (!files.ok()) {
        return StatusWithCode(files.status().code(),
                              site.Error(field.overridden ? 0 : site.Line(field.key), field.key,
                                         std::string(files.status().message())));
      }
      *field.path = *files;
      // A DatasetDict's validation split validates the job when nothing else was named.
      if (role == DatasetRoleSplit::kTrain && c->data.validation_path.empty() &&
          c->data.validation_fraction == 0 && fs::is_regular_file(absolute / "dataset_dict.json", ec) &&
          fs::is_directory(absolute / "validation", ec)) {
        c->data.validation_path = absolute.string();
      }
    }
  }
  // A folder the job starts from (made absolute): NOT_FOUND "'<folder>' is not <what> (no
  // <file>)<remedy>" for the first of `files` it lacks.
  auto resolve_folder = [&](const char* key, std::string* folder, std::initializer_list<const char*> files,
                            absl::string_view what, absl::string_view remedy) -> absl::Status {
    if (folder->empty()) return absl::OkStatus();
    std::error_code ec;
    const fs::path absolute = fs::absolute(from_base(*folder), ec).lexically_normal();
    QLORA_RETURN_IF_ERROR(allowed(key, absolute.string()));
    for (const char* file : files) {
      if (!fs::is_regular_file(absolute / file, ec)) {
        return StatusWithCode(absl::StatusCode::kNotFound,
                              site.ErrorAt(key, absl::StrCat("'", absolute.string(), "' is not ", what,
                                                             " (no ", file, ")", remedy)));
      }
    }
    *folder = absolute.string();
    return absl::OkStatus();
  };
  QLORA_RETURN_IF_ERROR(resolve_folder("adapter.pretrained_adapter_weights", &c->lora.pretrained_adapter_path,
                                       {"adapter_config.json", "adapter_model.safetensors"},
                                       "a PEFT adapter folder", ""));
  QLORA_RETURN_IF_ERROR(resolve_folder("trainer.resume_from_checkpoint", &c->trainer.resume_from_checkpoint,
                                       {"manifest.json"}, "a complete checkpoint of this service",
                                       "; a PEFT adapter folder goes in adapter.pretrained_adapter_weights"));
  if (base_model_path_written) {
    std::error_code ec;
    QLORA_RETURN_IF_ERROR(allowed("base_model_path", c->base_model_path));
    if (!fs::is_regular_file(fs::path(c->base_model_path) / "config.json", ec)) {
      return StatusWithCode(
          absl::StatusCode::kFailedPrecondition,
          site.ErrorAt("base_model_path", absl::StrCat("folder '", c->base_model_path,
                                                       "' has no config.json")));
    }
    return absl::OkStatus();
  }
  const std::string cache =
      options.hf_hub_cache.empty() ? DefaultHfHubCache() : options.hf_hub_cache;
  std::string base_model = c->base_model;
  {
    std::error_code ec;
    const fs::path local = from_base(base_model);
    const std::string absolute = fs::absolute(local, ec).lexically_normal().string();
    // A path (not a hub id, which names a folder of the operator's cache) is checked before
    // it is looked at.
    const bool is_path = fs::path(base_model).is_absolute() || absl::StartsWith(base_model, ".");
    const absl::Status may_look = allowed("base_model", absolute);
    if (is_path && !may_look.ok()) return may_look;
    if (local != fs::path(base_model) && may_look.ok() &&
        fs::is_regular_file(local / "config.json", ec)) {
      base_model = local.string();
    }
  }
  absl::StatusOr<std::string> resolved = ResolveBaseModelPath(base_model, cache);
  if (!resolved.ok()) {
    return StatusWithCode(resolved.status().code(),
                          site.Error(site.Line("base_model"), "",
                                     std::string(resolved.status().message())));
  }
  c->base_model_path = *resolved;
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> LoadSingleDocument(const ErrorSite& site, const std::string& text,
                                              size_t max_bytes) {
  if (text.size() > max_bytes) {
    return site.Error(0, "", absl::StrCat("the job file is ", text.size(),
                                          " bytes, more than the limit of ", max_bytes));
  }
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string::npos) {
    const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + bad, '\n'));
    return site.Error(line, "", absl::StrCat("not valid UTF-8 (byte ", bad,
                                             "); a job file must be UTF-8 text"));
  }
  YAML::Node document;
  try {
    // Not YAML::LoadAll: it never returns on some invalid files (yaml_stream_shape.h).
    const config_internal::YamlStreamShape shape = config_internal::ScanYamlStream(text);
    if (shape.stuck_line > 0) {
      return site.Error(shape.stuck_line, "", "not valid YAML: no node can start here");
    }
    if (shape.documents > 1) {
      return site.Error(shape.second_document_line, "",
                        absl::StrCat("holds ", shape.documents, " YAML documents; a job file "
                                     "holds one"));
    }
    document = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's guard against stack exhaustion
    return site.Error(e.mark.line + 1, "",
                      absl::StrCat("not valid YAML: nested more than ", e.depth() - 1,
                                   " levels deep"));
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    return site.Error(line, "", absl::StrCat("not valid YAML: ", e.msg));
  }
  if (document.IsNull()) return site.Error(0, "", "the job file is empty");
  if (!document.IsMap()) {
    return site.Error(LineOf(document), "",
                      absl::StrCat("the job file must be a mapping of fields (key: value) at "
                                   "the top level, got ", Describe(document)));
  }
  return document;
}

absl::StatusOr<JobConfig> Parse(ErrorSite* site, const std::string& text,
                                const ParseOptions& options) {
  QLORA_ASSIGN_OR_RETURN(YAML::Node root, LoadSingleDocument(*site, text, options.max_bytes));
  QLORA_ASSIGN_OR_RETURN(MapReader top, MapReader::Open(site, root, JobFileSchema(), ""));
  JobConfig c;
  c.input_features = {FeatureConfig{"instruction", "text"}};
  c.output_features = {FeatureConfig{"output", "text"}};
  c.lora.target_modules = {"q_proj", "v_proj"};  // what PEFT picks for LLaMA
  Presence presence;

  QLORA_RETURN_IF_ERROR(top.ReadString("name", &c.name));
  if (!options.name_override.empty()) c.name = options.name_override;
  if (std::string problem = JobNameProblem(c.name); !problem.empty()) {
    return top.Error("name", problem);
  }
  QLORA_RETURN_IF_ERROR(top.ReadChoice("model_type", {"llm"}, &c.model_type));
  QLORA_RETURN_IF_ERROR(top.ReadString("base_model", &c.base_model));
  if (absl::StripAsciiWhitespace(c.base_model).empty()) {
    return top.Error("base_model", "missing; name a local Hugging Face model folder or a hub "
                                   "name such as meta-llama/Llama-2-7b-hf");
  }
  const bool base_model_path_written = top.Has("base_model_path");
  QLORA_RETURN_IF_ERROR(top.ReadString("base_model_path", &c.base_model_path));
  if (!base_model_path_written) c.base_model_path = c.base_model;
  QLORA_RETURN_IF_ERROR(ReadFeatures(top, "input_features", &c.input_features));
  QLORA_RETURN_IF_ERROR(ReadFeatures(top, "output_features", &c.output_features));
  presence.features = top.Has("input_features") || top.Has("output_features");
  QLORA_RETURN_IF_ERROR(ReadAdapter(top, &c, &presence));
  presence.quantization_written = top.Get("quantization").IsDefined();
  QLORA_RETURN_IF_ERROR(ReadQuantization(top, &c.quantization));
  QLORA_RETURN_IF_ERROR(ReadBackend(top, c.quantization, &c.backend));
  QLORA_RETURN_IF_ERROR(ReadTrainer(top, c.backend.strategy.zero_stage_auto, &c.trainer));
  if (c.trainer.type == TrainerType::kDpo || c.trainer.type == TrainerType::kOrpo) {
    if (!presence.features) {  // TRL's preference columns
      c.input_features = {FeatureConfig{"prompt", "text"}};
      c.output_features = {FeatureConfig{"chosen", "text"}, FeatureConfig{"rejected", "text"}};
    }
  }
  QLORA_RETURN_IF_ERROR(ReadData(top, &c.data, &presence));
  QLORA_RETURN_IF_ERROR(config_internal::ReadLudwigDataSections(top, &c.data, &presence.split));
  QLORA_RETURN_IF_ERROR(config_internal::ReadGeneration(top, /*new_file=*/!options.stored, &c.generation));
  QLORA_RETURN_IF_ERROR(config_internal::ReadOutput(top, &c));
  QLORA_RETURN_IF_ERROR(top.ReadString("dataset", &c.data.train_path));
  QLORA_RETURN_IF_ERROR(top.ReadString("validation_dataset", &c.data.validation_path));
  QLORA_RETURN_IF_ERROR(top.ReadString("output_dir", &c.output_dir));
  if (!options.dataset_override.empty()) c.data.train_path = options.dataset_override;
  if (!options.validation_dataset_override.empty()) {
    c.data.validation_path = options.validation_dataset_override;
  }
  // The resolved copy is YAML, which holds UTF-8 only: a path that is not could not be stored.
  for (const auto& [given, what] : {std::pair{&options.dataset_override, "--dataset"},
                                    std::pair{&options.validation_dataset_override,
                                              "--validation-dataset"},
                                    std::pair{&options.base_dir, "the client's folder"}}) {
    if (FirstInvalidUtf8(*given) != std::string::npos) {
      return site->Error(0, "", absl::StrCat(what, " is not a valid UTF-8 path"));
    }
  }
  if (c.data.train_path.empty()) {
    return site->ErrorAt("dataset", "no training data: set `dataset:` in the job file or pass "
                                    "--dataset");
  }
  QLORA_RETURN_IF_ERROR(CheckCrossFieldRules(*site, c, presence));
  if (options.check_paths) {
    QLORA_RETURN_IF_ERROR(ResolvePaths(*site, options, base_model_path_written, &c));
  }
  return c;
}

}  // namespace

absl::StatusOr<JobConfig> ParseJobConfig(std::string_view yaml_text,
                                         const ParseOptions& options) {
  ErrorSite site(options.source_name);
  try {
    return Parse(&site, std::string(yaml_text), options);
  } catch (const YAML::Exception& e) {
    // Not expected (values are decoded without throwing), but yaml-cpp must not escape.
    const int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    return site.Error(line, "", absl::StrCat("could not read the job file: ", e.msg));
  }
}

absl::StatusOr<JobConfig> ParseResolvedJobConfig(std::string_view resolved_yaml) {
  ParseOptions options;
  options.source_name = "resolved job";
  options.check_paths = false;
  options.stored = true;
  return ParseJobConfig(resolved_yaml, options);
}

}  // namespace qlora
