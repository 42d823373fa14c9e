// adapter_config.json / adapter_model.safetensors and the merged HF checkpoint.
#include "worker/engine/peft_io.h"

#include <functional>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "common/safetensors/checkpoint_files.h"
#include "common/safetensors/sharded_writer.h"
#include "common/safetensors/writer.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "common/posix_files.h"
#include "worker/engine/base_weight_store.h"
#include "worker/engine/serving_files.h"
#include "worker/engine/tensor_io.h"

namespace qlora::engine {
namespace {

using Json = nlohmann::json;

// target_modules as PEFT records them: "all-linear" becomes the module names it resolved to.
std::vector<std::string> RecordedTargets(const LlamaForCausalLM& model) {
  const LoraOptions& lora = model.lora_options();
  if (!(lora.target_modules.size() == 1 && lora.target_modules[0] == "all-linear")) {
    return lora.target_modules;
  }
  return std::vector<std::string>(std::begin(kLinearModuleNames), std::end(kLinearModuleNames));
}

}  // namespace

absl::Status SaveAdapter(const LlamaForCausalLM& model, const std::string& dir,
                         const AdapterSaveOptions& options) {
  if (!model.has_lora()) return absl::FailedPreconditionError("the model has no LoRA adapters");
  QLORA_RETURN_IF_ERROR(MakeDirs(dir));
  const LoraOptions& lora = model.lora_options();
  // Every key peft 0.21.2's LoraConfig.save_pretrained writes, at peft's defaults where this
  // engine has no such feature (DoRA, LoRA bias, layer replication, ...).
  const Json config = {
      {"peft_type", "LORA"},
      {"peft_version", kPeftFormatVersion},
      {"task_type", "CAUSAL_LM"},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", options.base_model_name_or_path},
      {"revision", nullptr},
      {"inference_mode", true},
      {"r", lora.r},
      {"lora_alpha", lora.alpha},
      {"lora_dropout", lora.dropout},
      {"target_modules", RecordedTargets(model)},
      {"exclude_modules", nullptr},
      {"target_parameters", nullptr},
      {"bias", "none"},
      {"lora_bias", false},
      {"fan_in_fan_out", false},
      {"use_rslora", lora.use_rslora},
      {"use_dora", false},
      {"use_qalora", false},
      {"qalora_group_size", 16},
      {"use_bdlora", nullptr},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"layer_replication", nullptr},
      {"rank_pattern", Json::object()},
      {"alpha_pattern", Json::object()},
      {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"},
      {"loftq_config", Json::object()},
      {"eva_config", nullptr},
      {"corda_config", nullptr},
      {"lora_ga_config", nullptr},
      {"kasa_config", nullptr},
      {"velora_config", nullptr},
      {"monteclora_config", nullptr},
      {"arrow_config", nullptr},
      {"alora_invocation_tokens", nullptr},
      {"trainable_token_indices", nullptr},
      {"ensure_weight_tying", false},
  };
  QLORA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, kAdapterConfigFile), config.dump(2)));

  std::vector<std::string> bytes;
  std::vector<safetensors::TensorBytes> tensors;
  const auto params = model.TrainableParameters();
  bytes.reserve(params.size());
  for (const auto& [name, tensor] : params) {
    bytes.push_back(TensorToBytes(tensor.to(at::kFloat)));
    tensors.push_back({{name, safetensors::Dtype::kF32, tensor.sizes().vec()},
                       bytes.back().data(), bytes.back().size()});
  }
  return safetensors::WriteSafetensors(JoinPath(dir, kAdapterWeightsFile), tensors);
}

absl::Status LoadAdapter(LlamaForCausalLM* model, const std::string& dir) {
  QLORA_ASSIGN_OR_RETURN(const LoraOptions lora, ReadAdapterConfig(dir));
  QLORA_RETURN_IF_ERROR(model->AddLora(lora));
  return LoadAdapterWeights(model, dir);
}

absl::StatusOr<LoraOptions> ReadAdapterConfig(const std::string& dir) {
  const std::string config_path = JoinPath(dir, kAdapterConfigFile);
  QLORA_ASSIGN_OR_RETURN(const std::string text, ReadFile(config_path));
  const Json config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object() || config.value("peft_type", "") != "LORA") {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a LoRA config"));
  }
  LoraOptions lora;
  lora.r = config.value("r", int64_t{8});
  lora.alpha = config.value("lora_alpha", 8.0);
  lora.dropout = config.value("lora_dropout", 0.0);
  lora.use_rslora = config.value("use_rslora", false);
  const Json& targets = config.contains("target_modules") ? config["target_modules"] : Json();
  if (targets.is_string()) {
    lora.target_modules = {targets.get<std::string>()};
  } else if (targets.is_array()) {
    lora.target_modules = targets.get<std::vector<std::string>>();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": no target_modules"));
  }
  return lora;
}

absl::Status LoadAdapterWeights(LlamaForCausalLM* model, const std::string& dir) {
  QLORA_ASSIGN_OR_RETURN(safetensors::CheckpointFiles files,
                         safetensors::CheckpointFiles::OpenFile(
                             JoinPath(dir, kAdapterWeightsFile)));
  std::set<std::string> unused;
  for (const std::string& name : files.Names()) unused.insert(name);
  for (const auto& [name, param] : model->TrainableParameters()) {
    if (!files.Contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("adapter lacks \"", name, "\""));
    }
    QLORA_ASSIGN_OR_RETURN(safetensors::TensorView view, files.Get(name));
    if (view.shape != param.sizes().vec()) {
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor \"", name, "\" has the wrong shape"));
    }
    QLORA_ASSIGN_OR_RETURN(at::Tensor value, CopyToTensor(view, at::kFloat, param.device()));
    at::NoGradGuard no_grad;
    const_cast<at::Tensor&>(param).copy_(value);
    unused.erase(name);
  }
  if (!unused.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter has tensors the model does not use, e.g. \"", *unused.begin(), "\""));
  }
  return absl::OkStatus();
}

absl::Status SaveMergedModel(const LlamaForCausalLM& model, const std::string& dir,
                             const MergeOptions& options) {
  QLORA_RETURN_IF_ERROR(MakeDirs(dir));
  QLORA_ASSIGN_OR_RETURN(safetensors::Dtype dtype, ToSafetensorsDtype(options.dtype));
  LlamaConfig config = model.config();
  config.bnb.reset();
  config.torch_dtype = options.dtype == at::kFloat ? "float32"
                       : options.dtype == at::kHalf ? "float16" : "bfloat16";
  QLORA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, "config.json"), LlamaConfigToJson(config)));
  QLORA_RETURN_IF_ERROR(WriteServingFiles(options.base_model_dir, dir, config));

  // Tensors in transformers' state-dict order (which decides what lands in which shard), each
  // with its shape and how to compute it; only one is materialised at a time.
  struct Source {
    std::vector<int64_t> shape;
    std::function<at::Tensor()> make;
  };
  std::vector<safetensors::TensorSpec> specs;
  std::map<std::string, Source> sources;
  auto add = [&](const std::string& name, Source source) {
    specs.push_back({name, dtype, source.shape});
    sources[name] = std::move(source);
  };
  auto frozen = [&add](const std::string& name, const at::Tensor& t) {
    add(name, {t.sizes().vec(), [t] { return t; }});
  };
  frozen("model.embed_tokens.weight", model.embed_tokens);
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const DecoderLayer& layer = model.layers[i];
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    for (const char* module : kLinearModuleNames) {
      const LinearLayer* linear = &layer.Linear(module);
      // The layer's weights made whole when written (from a base weight store: gathered once
      // for its seven projections, which are written one after the other).
      add(prefix + ModulePath(module) + ".weight",
          {{linear->base.out_features, linear->base.in_features},
           [&model, i, module] {
             return model.WholeLayer(static_cast<int64_t>(i))->Linear(module).MergedWeight();
           }});
      if (linear->base.bias.defined()) frozen(prefix + ModulePath(module) + ".bias", linear->base.bias);
    }
    frozen(prefix + "input_layernorm.weight", layer.input_layernorm);
    frozen(prefix + "post_attention_layernorm.weight", layer.post_attention_layernorm);
  }
  frozen("model.norm.weight", model.norm);
  if (!config.tie_word_embeddings) frozen("lm_head.weight", model.lm_head);
  safetensors::ShardOptions shards;
  shards.max_shard_bytes = options.max_shard_bytes;
  try {
    return safetensors::WriteShardedSafetensors(
        dir, specs,
        [&](const safetensors::TensorSpec& spec, std::string* bytes) {
          at::NoGradGuard no_grad;
          *bytes = TensorToBytes(sources.at(spec.name).make().to(options.dtype));
          return absl::OkStatus();
        },
        shards);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("merging into ", dir, ": ", e.what_without_backtrace()));
  }
}

absl::Status JoinMergedModelSave(const LlamaForCausalLM& model) {
  const BaseWeightStore* store = model.base_weight_store();
  if (store == nullptr || store->world_size() == 1) return absl::OkStatus();
  try {
    for (size_t i = 0; i < model.layers.size(); ++i) model.WholeLayer(static_cast<int64_t>(i));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("merging: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace qlora::engine
