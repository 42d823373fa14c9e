// PEFT adapters in and out, and the merged model out.
//
// SaveAdapter writes `dir`/adapter_config.json (PEFT LoraConfig: every key peft
// kPeftFormatVersion writes, sorted) and
// `dir`/adapter_model.safetensors with PEFT's key names
// ("base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight", float32) and
// {"format": "pt"} metadata, which `PeftModel.from_pretrained` loads as is.
// LoadAdapter adds adapters described by such a folder (ours or PEFT's) to a model.
// SaveMergedModel writes a complete HF model folder: config.json, generation_config.json, the base
// model's tokenizer files (serving_files.h) and model.safetensors, or shards + index above the
// shard limit, whose linear weights are W + scale * B A (W dequantized when 4-bit), streaming
// one tensor at a time.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "common/safetensors/sharded_writer.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {

inline constexpr char kAdapterConfigFile[] = "adapter_config.json";
inline constexpr char kAdapterWeightsFile[] = "adapter_model.safetensors";
// The peft release whose adapter_config.json key set (LoraConfig().to_dict()) ours matches,
// written as its "peft_version"; tests/engine/outputs_test.cc checks the keys against the
// installed peft.
inline constexpr char kPeftFormatVersion[] = "0.21.2";

struct AdapterSaveOptions {
  std::string base_model_name_or_path;  // recorded in adapter_config.json
};

// FailedPrecondition when the model has no adapters.
absl::Status SaveAdapter(const LlamaForCausalLM& model, const std::string& dir,
                         const AdapterSaveOptions& options = {});

// Reads adapter_config.json (r, lora_alpha, lora_dropout, target_modules, use_rslora) and the
// weights. InvalidArgument on missing/unexpected keys or wrong shapes.
absl::Status LoadAdapter(LlamaForCausalLM* model, const std::string& dir);
// The two halves of LoadAdapter: the folder's LoRA settings (InvalidArgument when
// adapter_config.json is not a LoRA config), and its weights into the adapters `model` already
// has (InvalidArgument naming a missing, unexpected or misshapen tensor).
absl::StatusOr<LoraOptions> ReadAdapterConfig(const std::string& dir);
absl::Status LoadAdapterWeights(LlamaForCausalLM* model, const std::string& dir);

struct MergeOptions {
  at::ScalarType dtype = at::kBFloat16;  // of every written tensor
  // The base model folder, whose generation_config.json and tokenizer files are copied ("":
  // none; generation_config.json is then made from the model's config).
  std::string base_model_dir;
  // transformers' save_pretrained(max_shard_size="5GB"); tests set a tiny limit.
  uint64_t max_shard_bytes = safetensors::kDefaultMaxShardBytes;
};

absl::Status SaveMergedModel(const LlamaForCausalLM& model, const std::string& dir,
                             const MergeOptions& options = {});
// What every other rank runs while one rank runs SaveMergedModel on a model whose base weights
// are partitioned (base_weight_store.h): the same gathers, layer by layer, in the same order.
// Nothing to do otherwise.
absl::Status JoinMergedModelSave(const LlamaForCausalLM& model);

}  // namespace qlora::engine
