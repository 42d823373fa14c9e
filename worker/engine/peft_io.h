// PEFT adapters in and out, and the merged model out.
//
// SaveAdapter writes `dir`/adapter_config.json (PEFT LoraConfig, sorted keys) and
// `dir`/adapter_model.safetensors with PEFT's key names
// ("base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight", float32) and
// {"format": "pt"} metadata, which `PeftModel.from_pretrained` loads as is.
// LoadAdapter adds adapters described by such a folder (ours or PEFT's) to a model.
// SaveMergedModel writes an HF folder (config.json + model.safetensors) whose linear weights are
// W + scale * B A (W dequantized when 4-bit), streaming one tensor at a time.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {

inline constexpr char kAdapterConfigFile[] = "adapter_config.json";
inline constexpr char kAdapterWeightsFile[] = "adapter_model.safetensors";

struct AdapterSaveOptions {
  std::string base_model_name_or_path;  // recorded in adapter_config.json
};

// FailedPrecondition when the model has no adapters.
absl::Status SaveAdapter(const LlamaForCausalLM& model, const std::string& dir,
                         const AdapterSaveOptions& options = {});

// Reads adapter_config.json (r, lora_alpha, lora_dropout, target_modules, use_rslora) and the
// weights. InvalidArgument on missing/unexpected keys or wrong shapes.
absl::Status LoadAdapter(LlamaForCausalLM* model, const std::string& dir);

struct MergeOptions {
  at::ScalarType dtype = at::kBFloat16;  // of every written tensor
};

absl::Status SaveMergedModel(const LlamaForCausalLM& model, const std::string& dir,
                             const MergeOptions& options = {});

}  // namespace qlora::engine
