// Random HF LLaMA/Mistral/Qwen2 folders: names and shapes from the config, values from a
// per-tensor seed.
#include "worker/engine/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors/checkpoint_files.h"
#include "common/safetensors/sharded_writer.h"
#include "common/safetensors/writer.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "common/posix_files.h"
#include "common/model/model_family.h"
#include "kernels/codebooks_4bit.h"

namespace qlora::engine {
namespace {

using safetensors::Dtype;
using safetensors::TensorSpec;

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint16_t RoundToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t RoundToF16(float f) {
  // IEEE half via the compiler's conversion (values here are small and normal).
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// Pre-quantized linears (TinyModelOptions::bnb_nf4): what dequantizes the block scales. Every
// absmax code then gives a scale in [kNestedOffset - kNestedAbsmax, kNestedOffset + kNestedAbsmax].
constexpr int64_t kBnbBlocksize = 64;
constexpr int64_t kBnbNestedBlocksize = 256;
constexpr float kNestedOffset = 0.05f;
constexpr float kNestedAbsmax = 0.01f;
constexpr const char* kQuantStateSuffix = ".quant_state.bitsandbytes__nf4";

// The JSON bitsandbytes' QuantState.as_dict(packed=True) stores for one weight.
std::string QuantStateJson(int64_t out, int64_t in, const std::string& dtype) {
  return nlohmann::json{{"quant_type", "nf4"},
                        {"blocksize", kBnbBlocksize},
                        {"dtype", dtype},
                        {"shape", {out, in}},
                        {"nested_blocksize", kBnbNestedBlocksize},
                        {"nested_dtype", "float32"},
                        {"nested_offset", kNestedOffset}}
      .dump();
}

// A linear weight's specs: one dense tensor, or bitsandbytes' six keys.
void AddLinear(std::vector<TensorSpec>* specs, const std::string& name, int64_t out, int64_t in,
               Dtype dtype, bool bnb_nf4, const std::string& dtype_name) {
  if (!bnb_nf4) {
    specs->push_back({name, dtype, {out, in}});
    return;
  }
  const int64_t n = out * in;
  const int64_t blocks = (n + kBnbBlocksize - 1) / kBnbBlocksize;
  const int64_t nested = (blocks + kBnbNestedBlocksize - 1) / kBnbNestedBlocksize;
  specs->push_back({name, Dtype::kU8, {(n + 1) / 2, 1}});
  specs->push_back({name + ".absmax", Dtype::kU8, {blocks}});
  specs->push_back({name + ".nested_absmax", Dtype::kF32, {nested}});
  specs->push_back({name + ".nested_quant_map", Dtype::kF32, {256}});
  specs->push_back({name + ".quant_map", Dtype::kF32, {16}});
  specs->push_back({name + kQuantStateSuffix, Dtype::kU8,
                    {static_cast<int64_t>(QuantStateJson(out, in, dtype_name).size())}});
}

// The bytes of one pre-quantized key (AddLinear's), or false when `spec` is not one.
bool ProduceBnb(const TensorSpec& spec, const LlamaConfig& config, std::mt19937_64& rng,
                const std::string& dtype_name, std::string* bytes) {
  auto fill_random = [&] {
    for (size_t i = 0; i < bytes->size(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(bytes->data() + i, &r, std::min<size_t>(8, bytes->size() - i));
    }
  };
  auto floats = [&](const float* v, size_t count) {
    bytes->assign(reinterpret_cast<const char*>(v), count * sizeof(float));
  };
  const std::string& name = spec.name;
  if (absl::EndsWith(name, kQuantStateSuffix)) {
    // "model.layers.N.self_attn.q_proj.weight.quant_state..." -> q_proj's shape.
    const std::string weight = name.substr(0, name.size() - std::strlen(kQuantStateSuffix));
    const std::string module_path = weight.substr(0, weight.size() - std::strlen(".weight"));
    const std::string module = module_path.substr(module_path.rfind('.') + 1);
    const LlamaConfig::Features f = config.ProjectionFeatures(module);
    *bytes = QuantStateJson(f.out, f.in, dtype_name);
  } else if (absl::EndsWith(name, ".quant_map")) {
    floats(kernels::kNf4Values.v, 16);
  } else if (absl::EndsWith(name, ".nested_quant_map")) {
    floats(kernels::kDynamicMap.v, 256);
  } else if (absl::EndsWith(name, ".nested_absmax")) {
    const std::vector<float> scales(spec.shape[0], kNestedAbsmax);
    floats(scales.data(), scales.size());
  } else if (spec.dtype == Dtype::kU8 && (absl::EndsWith(name, ".absmax") ||
                                          absl::EndsWith(name, "proj.weight"))) {
    bytes->resize(safetensors::TensorByteSize(spec));
    fill_random();  // random 4-bit codes, and random codes of the block scales
  } else {
    return false;
  }
  return true;
}

std::vector<TensorSpec> Specs(const LlamaConfig& c, Dtype dtype, bool bnb_nf4,
                              const std::string& dtype_name) {
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", dtype, {c.vocab_size, c.hidden_size}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", dtype, {c.hidden_size}});
    specs.push_back({p + "post_attention_layernorm.weight", dtype, {c.hidden_size}});
    // HF module paths ("self_attn.q_proj"); shapes from the config's one projection table.
    constexpr const char* kPaths[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                      "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                      "mlp.down_proj"};
    for (const char* path : kPaths) {
      const LlamaConfig::Features f = c.ProjectionFeatures(std::strchr(path, '.') + 1);
      AddLinear(&specs, absl::StrCat(p, path, ".weight"), f.out, f.in, dtype, bnb_nf4, dtype_name);
    }
    for (const char* path : kPaths) {
      const char* module = std::strchr(path, '.') + 1;
      if (c.ProjectionHasBias(module)) {
        specs.push_back({absl::StrCat(p, path, ".bias"), dtype, {c.ProjectionFeatures(module).out}});
      }
    }
  }
  specs.push_back({"model.norm.weight", dtype, {c.hidden_size}});
  if (!c.tie_word_embeddings) {
    specs.push_back({"lm_head.weight", dtype, {c.vocab_size, c.hidden_size}});
  }
  return specs;
}

}  // namespace

LlamaConfig TinyLlamaConfig() {
  LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

absl::Status SetModelFamily(const std::string& model_type, int64_t sliding_window,
                            LlamaConfig* config) {
  const ModelFamily* family = FindModelFamily(model_type);
  if (family == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model type \"", model_type,
                                                   "\" is not one of ", SupportedModelTypes()));
  }
  // The family's own parser fills the fields, from what its config.json would say.
  const nlohmann::json fields = {
      {"sliding_window", sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json()},
      {"use_sliding_window", sliding_window > 0},
      {"max_window_layers", 0}};
  config->model_type = model_type;
  config->qkv_bias = config->o_bias = false;
  return family->parse_fields(fields, config);
}

absl::Status MakeTinyModel(const std::string& dir, const TinyModelOptions& options) {
  Dtype dtype;
  if (options.dtype == "float32") {
    dtype = Dtype::kF32;
  } else if (options.dtype == "bfloat16") {
    dtype = Dtype::kBF16;
  } else if (options.dtype == "float16") {
    dtype = Dtype::kF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tiny model dtype \"", options.dtype, "\": use float32, bfloat16 or float16"));
  }
  QLORA_RETURN_IF_ERROR(MakeDirs(dir));

  LlamaConfig config = options.config;
  config.torch_dtype = options.dtype;
  config.bnb.reset();
  std::string config_json = LlamaConfigToJson(config, options.rope_form);
  if (options.bnb_nf4) {
    nlohmann::json json = nlohmann::json::parse(config_json);
    json["quantization_config"] = {{"quant_method", "bitsandbytes"},
                                   {"load_in_4bit", true},
                                   {"load_in_8bit", false},
                                   {"bnb_4bit_quant_type", "nf4"},
                                   {"bnb_4bit_use_double_quant", true},
                                   {"bnb_4bit_compute_dtype", options.dtype},
                                   {"bnb_4bit_quant_storage", "uint8"}};
    config_json = json.dump(2);
  }
  QLORA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, "config.json"), config_json));

  const std::vector<TensorSpec> specs = Specs(config, dtype, options.bnb_nf4, options.dtype);
  auto produce = [&](const TensorSpec& spec, std::string* bytes) {
    std::seed_seq seq{options.seed, Fnv1a(spec.name)};
    std::mt19937_64 rng(seq);
    if (options.bnb_nf4 && ProduceBnb(spec, config, rng, options.dtype, bytes)) {
      return absl::OkStatus();
    }
    const bool is_norm = absl::EndsWith(spec.name, "norm.weight");
    std::normal_distribution<float> normal(is_norm ? 1.0f : 0.0f,
                                           is_norm ? 0.1f : static_cast<float>(options.init_std));
    const uint64_t numel = safetensors::TensorByteSize(spec) * 8 / safetensors::DtypeBits(spec.dtype);
    bytes->resize(safetensors::TensorByteSize(spec));
    for (uint64_t i = 0; i < numel; ++i) {
      const float v = normal(rng);
      if (dtype == Dtype::kF32) {
        std::memcpy(bytes->data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = dtype == Dtype::kBF16 ? RoundToBf16(v) : RoundToF16(v);
        std::memcpy(bytes->data() + 2 * i, &h, 2);
      }
    }
    return absl::OkStatus();
  };

  if (options.max_shard_bytes == 0) {
    return safetensors::WriteSafetensors(JoinPath(dir, safetensors::kSingleFileName),
                                         specs, produce);
  }
  safetensors::ShardOptions shards;
  shards.max_shard_bytes = options.max_shard_bytes;
  shards.always_index = true;
  return safetensors::WriteShardedSafetensors(dir, specs, produce, shards);
}

}  // namespace qlora::engine
