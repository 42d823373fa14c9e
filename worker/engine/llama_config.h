// The Hugging Face LLaMA config.json, parsed and validated (torch-free).
//
// Both rope forms are accepted: transformers 4's top-level `rope_theta` + `rope_scaling`, and
// transformers 5's `rope_parameters` ({"rope_type", "rope_theta", ...}); `type` is accepted as
// an alias of `rope_type`. Rope types: default, linear, llama3. A `quantization_config` from
// bitsandbytes (load_in_4bit) is parsed into `bnb`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

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

struct LlamaConfig {
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
};

// Parses config.json text. InvalidArgument names the offending field; Unimplemented for
// features this engine does not model (biases, other activations, other rope types).
absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view json_text);
// Reads `dir`/config.json.
absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& dir);

enum class RopeJsonForm { kRopeScaling, kRopeParameters };
// config.json text that transformers' LlamaConfig reads back to the same model (no
// quantization_config; callers add one when they write quantized weights).
std::string LlamaConfigToJson(const LlamaConfig& config,
                              RopeJsonForm form = RopeJsonForm::kRopeScaling);

}  // namespace qlora::engine
