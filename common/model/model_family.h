// The model families the engine trains, by config.json `model_type`: the one place that says
// how a family differs from LLaMA (torch-free).
//
// Every supported family is a LLaMA-shaped decoder (RMSNorm, rotary attention with GQA, SwiGLU
// MLP, the same HF tensor names); what differs is read from config.json into LlamaConfig's
// family fields and written back by the same entry:
//   llama    attention_bias (q/k/v/o biases), mlp_bias refused.
//   mistral  sliding_window: every layer attends to the last `sliding_window` positions.
//   qwen2    q/k/v biases always; use_sliding_window + max_window_layers or layer_types choose
//            the layers that use the window (transformers' Qwen2Config rules).
// Adding a family = one entry in model_family.cc (its fields' parser and writer, its class name).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace qlora::engine {

struct LlamaConfig;

struct ModelFamily {
  const char* model_type;    // config.json "model_type"
  const char* architecture;  // config.json "architectures"[0], e.g. "MistralForCausalLM"
  // Reads the family's own fields of config.json into *config (its shape fields are read
  // already). InvalidArgument names a bad field, Unimplemented a feature the engine lacks.
  absl::Status (*parse_fields)(const nlohmann::json& json, LlamaConfig* config);
  // Writes them into *json so that transformers reads back the same model.
  void (*write_fields)(const LlamaConfig& config, nlohmann::json* json);
};

// The family of `model_type`, or nullptr.
const ModelFamily* FindModelFamily(absl::string_view model_type);
// "llama, mistral, qwen2": for messages that refuse another family.
std::string SupportedModelTypes();

}  // namespace qlora::engine
