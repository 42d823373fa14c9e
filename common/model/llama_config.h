// The Hugging Face config.json of a LLaMA-shaped model (LLaMA, Mistral, Qwen2: see
// model_family.h), parsed and validated (torch-free).
//
// Both rope forms are accepted: transformers 4's top-level `rope_theta` + `rope_scaling`, and
// transformers 5's `rope_parameters` ({"rope_type", "rope_theta", ...}); `type` is accepted as
// an alias of `rope_type`. Rope types: default, linear, llama3. A `quantization_config` from
// bitsandbytes (load_in_4bit) is parsed into `bnb`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::engine {

enum class RopeType { kDefault, kLinear, kLlama3 };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                          // linear, llama3
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// `quantization_config` of a checkpoint saved by bitsandbytes/transformers in 4 bits.
struct BnbQuantizationConfig {
  std::string quant_type = "nf4";     // bnb_4bit_quant_type: nf4 | fp4
  bool double_quant = false;          // bnb_4bit_use_double_quant
  std::string compute_dtype = "float32";  // bnb_4bit_compute_dtype
};

// The seven projections of a decoder layer, by their HF module names, in the order the engine,
// the adapters and the memory plans list them.
inline constexpr const char* kProjectionNames[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

struct LlamaConfig {
  std::string model_type = "llama";   // the family (model_family.h)
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;   // GQA when smaller than num_attention_heads
  int64_t head_dim = 128;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  std::string torch_dtype = "float32";  // `dtype` (transformers 5) or `torch_dtype`
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;             // the first one when config.json lists several
  std::optional<BnbQuantizationConfig> bnb;  // set when the checkpoint is pre-quantized

  // What a family adds to LLaMA (model_family.h reads and writes these).
  bool qkv_bias = false;  // q/k/v projections have a bias (Qwen2; LLaMA's attention_bias)
  bool o_bias = false;    // o_proj has a bias (LLaMA's attention_bias)
  int64_t sliding_window = 0;       // attention window in positions; 0: none
  std::vector<bool> sliding_layers; // per layer: attends within the window (empty: none does)
  int64_t max_window_layers = 0;    // Qwen2's field, kept to write config.json back

  // Whether layer `layer` attends only to the last sliding_window positions.
  bool SlidingLayer(int64_t layer) const {
    return sliding_window > 0 && layer < static_cast<int64_t>(sliding_layers.size()) &&
           sliding_layers[layer];
  }
  // The input and output features of projection `module` ("q_proj" ... "down_proj"); {0, 0}
  // for any other name.
  struct Features {
    int64_t in = 0, out = 0;
  };
  Features ProjectionFeatures(absl::string_view module) const {
    const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
    if (module == "q_proj") return {hidden_size, q};
    if (module == "k_proj" || module == "v_proj") return {hidden_size, kv};
    if (module == "o_proj") return {q, hidden_size};
    if (module == "gate_proj" || module == "up_proj") return {hidden_size, intermediate_size};
    if (module == "down_proj") return {intermediate_size, hidden_size};
    return {};
  }
  // Whether projection `module` ("q_proj", ...) has a bias.
  bool ProjectionHasBias(absl::string_view module) const {
    if (module == "o_proj") return o_bias;
    return qkv_bias && (module == "q_proj" || module == "k_proj" || module == "v_proj");
  }
};

// Parses config.json text. InvalidArgument names the offending field; Unimplemented for
// features this engine does not model (another model_type, MLP biases, other activations,
// other rope types).
absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json_text);
// Reads `dir`/config.json.
absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& dir);

enum class RopeJsonForm { kRopeScaling, kRopeParameters };
// config.json text that transformers' config class of the family reads back to the same model (no
// quantization_config; callers add one when they write quantized weights).
std::string LlamaConfigToJson(const LlamaConfig& config,
                              RopeJsonForm form = RopeJsonForm::kRopeScaling);

}  // namespace qlora::engine
