// ExportGguf: the tensor map, the hyperparameters and the conversions (see gguf_export.h).
#include "worker/export/gguf_export.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/llama_config.h"
#include "common/safetensors/checkpoint_files.h"
#include "common/status_macros.h"
#include "worker/export/gguf_file.h"
#include "worker/export/gguf_quant.h"
#include "worker/export/gguf_vocab.h"

namespace qlora::gguf {
namespace {

using engine::LlamaConfig;
using engine::RopeConfig;
using engine::RopeType;
using engine::LoadLlamaConfig;

struct Mapped {
  std::string hf, gguf;
  int64_t permute_heads = 0;  // > 0: reorder the rows of this many heads (llama.cpp's rotary)
};

std::vector<Mapped> TensorMap(const LlamaConfig& c, bool llama_arch,
                              const safetensors::CheckpointFiles& files) {
  std::vector<Mapped> map = {{"model.embed_tokens.weight", "token_embd.weight"}};
  const int64_t q_heads = llama_arch ? c.num_attention_heads : 0;
  const int64_t k_heads = llama_arch ? c.num_key_value_heads : 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string hf = absl::StrCat("model.layers.", i, ".");
    const std::string blk = absl::StrCat("blk.", i, ".");
    map.push_back({hf + "input_layernorm.weight", blk + "attn_norm.weight"});
    for (const char* suffix : {"weight", "bias"}) {
      map.push_back({hf + "self_attn.q_proj." + suffix, blk + "attn_q." + suffix, q_heads});
      map.push_back({hf + "self_attn.k_proj." + suffix, blk + "attn_k." + suffix, k_heads});
      map.push_back({hf + "self_attn.v_proj." + suffix, blk + "attn_v." + suffix});
      map.push_back({hf + "self_attn.o_proj." + suffix, blk + "attn_output." + suffix});
    }
    map.push_back({hf + "post_attention_layernorm.weight", blk + "ffn_norm.weight"});
    map.push_back({hf + "mlp.gate_proj.weight", blk + "ffn_gate.weight"});
    map.push_back({hf + "mlp.up_proj.weight", blk + "ffn_up.weight"});
    map.push_back({hf + "mlp.down_proj.weight", blk + "ffn_down.weight"});
  }
  map.push_back({"model.norm.weight", "output_norm.weight"});
  map.push_back({"lm_head.weight", "output.weight"});
  std::vector<Mapped> present;
  for (Mapped& m : map) {
    if (files.Contains(m.hf)) present.push_back(std::move(m));
  }
  return present;
}

absl::StatusOr<std::vector<float>> AsFloat(const safetensors::TensorView& view, const std::string& name) {
  const int64_t n = static_cast<int64_t>(view.nbytes * 8 / safetensors::DtypeBits(view.dtype));
  std::vector<float> out(n);
  switch (view.dtype) {
    case safetensors::Dtype::kF32: std::memcpy(out.data(), view.data, n * 4); break;
    case safetensors::Dtype::kBF16:
    case safetensors::Dtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, view.data + 2 * i, 2);
        out[i] = view.dtype == safetensors::Dtype::kBF16 ? Bf16ToFloat(v) : HalfToFloat(v);
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(name, ": dtype ", safetensors::DtypeName(view.dtype),
                                                     " cannot go into a GGUF (F32, F16 or BF16 only)"));
  }
  return out;
}

// The rows of `heads` heads reordered from HF's rotary halves to llama.cpp's interleaved pairs
// (its converter's LlamaModel.permute): row h*d + 2j + t <- row h*d + t*d/2 + j.
std::vector<float> PermuteHeads(const std::vector<float>& x, int64_t heads, int64_t columns) {
  const int64_t rows = static_cast<int64_t>(x.size()) / columns, head_rows = rows / heads;
  std::vector<float> out(x.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < head_rows / 2; ++j) {
      for (int64_t t = 0; t < 2; ++t) {
        const int64_t to = h * head_rows + 2 * j + t, from = h * head_rows + t * head_rows / 2 + j;
        std::memcpy(&out[to * columns], &x[from * columns], columns * sizeof(float));
      }
    }
  }
  return out;
}

TensorType TypeOf(const std::vector<int64_t>& shape, GgufType wanted) {
  if (shape.size() < 2) return TensorType::kF32;
  switch (wanted) {
    case GgufType::kF32: return TensorType::kF32;
    case GgufType::kF16: return TensorType::kF16;
    case GgufType::kBF16: return TensorType::kBF16;
    case GgufType::kQ8_0: return shape.back() % 32 == 0 ? TensorType::kQ8_0 : TensorType::kF16;
  }
  return TensorType::kF32;
}

std::vector<uint8_t> Encode(const std::vector<float>& x, TensorType type) {
  std::vector<uint8_t> out;
  switch (type) {
    case TensorType::kF32:
      out.resize(x.size() * 4);
      std::memcpy(out.data(), x.data(), out.size());
      break;
    case TensorType::kF16:
    case TensorType::kBF16:
      out.resize(x.size() * 2);
      for (size_t i = 0; i < x.size(); ++i) {
        const uint16_t v = type == TensorType::kF16 ? FloatToHalf(x[i]) : FloatToBf16(x[i]);
        std::memcpy(&out[2 * i], &v, 2);
      }
      break;
    case TensorType::kQ8_0:
      out.resize(x.size() / 32 * 34);
      QuantizeQ8_0(x.data(), static_cast<int64_t>(x.size()), out.data());
      break;
  }
  return out;
}

// LLaMA-3's rope scaling as llama.cpp reads it: one factor per frequency (rope_freqs.weight),
// computed as its converter computes them.
std::vector<float> Llama3RopeFactors(const LlamaConfig& c) {
  const RopeConfig& r = c.rope;
  const double low_wavelen = r.original_max_position_embeddings / r.low_freq_factor;
  const double high_wavelen = r.original_max_position_embeddings / r.high_freq_factor;
  std::vector<float> factors;
  for (int64_t i = 0; i < c.head_dim; i += 2) {
    const double freq = 1.0 / std::pow(r.theta, static_cast<double>(i) / c.head_dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(static_cast<float>(r.factor));
    } else {
      const double smooth = (r.original_max_position_embeddings / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return factors;
}

uint32_t FileType(GgufType type) {
  switch (type) {
    case GgufType::kF32: return 0;
    case GgufType::kF16: return 1;
    case GgufType::kQ8_0: return 7;
    case GgufType::kBF16: return 32;
  }
  return 1;
}

void AddHyperparameters(const LlamaConfig& c, const std::string& arch, GgufWriter* w) {
  auto key = [&](const char* name) { return absl::StrCat(arch, ".", name); };
  w->AddUint32(key("vocab_size"), static_cast<uint32_t>(c.vocab_size));
  w->AddUint32(key("context_length"), static_cast<uint32_t>(c.max_position_embeddings));
  w->AddUint32(key("embedding_length"), static_cast<uint32_t>(c.hidden_size));
  w->AddUint32(key("block_count"), static_cast<uint32_t>(c.num_hidden_layers));
  w->AddUint32(key("feed_forward_length"), static_cast<uint32_t>(c.intermediate_size));
  w->AddUint32(key("rope.dimension_count"), static_cast<uint32_t>(c.head_dim));
  w->AddUint32(key("attention.head_count"), static_cast<uint32_t>(c.num_attention_heads));
  w->AddUint32(key("attention.head_count_kv"), static_cast<uint32_t>(c.num_key_value_heads));
  w->AddUint32(key("attention.key_length"), static_cast<uint32_t>(c.head_dim));
  w->AddUint32(key("attention.value_length"), static_cast<uint32_t>(c.head_dim));
  w->AddFloat32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(c.rms_norm_eps));
  w->AddFloat32(key("rope.freq_base"), static_cast<float>(c.rope.theta));
  if (c.rope.type == RopeType::kLinear) {
    w->AddString(key("rope.scaling.type"), "linear");
    w->AddFloat32(key("rope.scaling.factor"), static_cast<float>(c.rope.factor));
  }
}

void AddVocab(const GgufVocab& v, const LlamaConfig& c, GgufWriter* w) {
  w->AddString("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) w->AddString("tokenizer.ggml.pre", v.pre);
  w->AddStringArray("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w->AddFloat32Array("tokenizer.ggml.scores", v.scores);
  w->AddInt32Array("tokenizer.ggml.token_type", v.types);
  if (!v.merges.empty()) w->AddStringArray("tokenizer.ggml.merges", v.merges);
  w->AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos_id.value_or(c.bos_token_id)));
  w->AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos_id.value_or(c.eos_token_id)));
  if (v.unk_id) w->AddUint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(*v.unk_id));
  if (v.pad_id) w->AddUint32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*v.pad_id));
  if (v.add_bos) w->AddBool("tokenizer.ggml.add_bos_token", *v.add_bos);
  if (v.add_eos) w->AddBool("tokenizer.ggml.add_eos_token", *v.add_eos);
  if (!v.chat_template.empty()) w->AddString("tokenizer.chat_template", v.chat_template);
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace

absl::StatusOr<GgufType> ParseGgufType(absl::string_view name) {
  if (name == "f32") return GgufType::kF32;
  if (name == "f16") return GgufType::kF16;
  if (name == "bf16") return GgufType::kBF16;
  if (name == "q8_0") return GgufType::kQ8_0;
  return absl::InvalidArgumentError(absl::StrCat("GGUF type '", name, "': expected f16, bf16, q8_0 or f32"));
}

const char* GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kF32: return "f32";
    case GgufType::kF16: return "f16";
    case GgufType::kBF16: return "bf16";
    case GgufType::kQ8_0: return "q8_0";
  }
  return "f16";
}

absl::Status ExportGguf(const std::string& model_dir, const std::string& out_path,
                        const GgufExportOptions& options) {
  QLORA_ASSIGN_OR_RETURN(LlamaConfig config, LoadLlamaConfig(model_dir));
  if (config.bnb) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_dir, " holds bitsandbytes 4-bit weights: export a merged model (full-precision) instead"));
  }
  const bool llama_arch = config.model_type == "llama" || config.model_type == "mistral";
  if (!llama_arch && config.model_type != "qwen2") {
    return absl::InvalidArgumentError(absl::StrCat("model_type ", config.model_type, " has no GGUF export here"));
  }
  const std::string arch = llama_arch ? "llama" : "qwen2";
  QLORA_ASSIGN_OR_RETURN(safetensors::CheckpointFiles files, safetensors::CheckpointFiles::Open(model_dir));
  QLORA_ASSIGN_OR_RETURN(GgufVocab vocab, ReadGgufVocab(model_dir, config.vocab_size, config.model_type));

  GgufWriter writer;
  writer.AddString("general.architecture", arch);
  writer.AddString("general.type", "model");
  writer.AddString("general.name", options.name.empty() ? BaseName(model_dir) : options.name);
  writer.AddUint32("general.quantization_version", 2);
  writer.AddUint32("general.file_type", FileType(options.type));
  AddHyperparameters(config, arch, &writer);
  AddVocab(vocab, config, &writer);

  const std::vector<Mapped> map = TensorMap(config, llama_arch, files);
  std::vector<TensorType> types;
  for (const Mapped& m : map) {
    QLORA_ASSIGN_OR_RETURN(safetensors::TensorInfo info, files.Info(m.hf));
    types.push_back(TypeOf(info.shape, options.type));
    writer.DeclareTensor(m.gguf, info.shape, types.back());
  }
  const bool llama3_rope = config.rope.type == RopeType::kLlama3;
  const std::vector<float> rope_factors = llama3_rope ? Llama3RopeFactors(config) : std::vector<float>();
  if (llama3_rope) {
    writer.DeclareTensor("rope_freqs.weight", {static_cast<int64_t>(rope_factors.size())}, TensorType::kF32);
  }
  const std::string partial = out_path + ".partial";
  QLORA_RETURN_IF_ERROR(writer.Begin(partial));
  for (size_t i = 0; i < map.size(); ++i) {
    QLORA_ASSIGN_OR_RETURN(safetensors::TensorView view, files.Get(map[i].hf));
    QLORA_ASSIGN_OR_RETURN(std::vector<float> values, AsFloat(view, map[i].hf));
    if (map[i].permute_heads > 0) {
      const int64_t columns = view.shape.size() == 2 ? view.shape[1] : 1;
      values = PermuteHeads(values, map[i].permute_heads, columns);
    }
    const std::vector<uint8_t> bytes = Encode(values, types[i]);
    QLORA_RETURN_IF_ERROR(writer.WriteTensor(bytes.data(), static_cast<int64_t>(bytes.size())));
    files.Evict(map[i].hf, view);
  }
  if (llama3_rope) {
    QLORA_RETURN_IF_ERROR(writer.WriteTensor(rope_factors.data(),
                                             static_cast<int64_t>(rope_factors.size() * sizeof(float))));
  }
  QLORA_RETURN_IF_ERROR(writer.Finish());
  if (std::rename(partial.c_str(), out_path.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat("cannot rename ", partial, " to ", out_path));
  }
  return absl::OkStatus();
}

}  // namespace qlora::gguf
