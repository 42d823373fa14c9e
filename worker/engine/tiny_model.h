// Makes random LLaMA-family checkpoints as Hugging Face folders (config.json + model.safetensors,
// or shards + model.safetensors.index.json), for demos, tests and benchmarks (of any shape, also
// pre-quantized as bitsandbytes writes it); torch-free. Each tensor's
// values depend only on (seed, tensor name), so sharding does not change them. Tensors are
// generated and written one at a time.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/model/llama_config.h"

namespace qlora::engine {

// vocab 256, hidden 64, intermediate 128, 2 layers, 4 heads, 2 kv heads, head_dim 16.
LlamaConfig TinyLlamaConfig();

// Makes *config a `model_type` model (model_family.h) as that family's config class has it by
// default (Qwen2: q/k/v biases), with a `sliding_window` (0: none) on every layer.
// InvalidArgument for an unknown family.
absl::Status SetModelFamily(const std::string& model_type, int64_t sliding_window,
                            LlamaConfig* config);

struct TinyModelOptions {
  LlamaConfig config = TinyLlamaConfig();
  uint64_t seed = 0;
  double init_std = 0.02;        // N(0, std) for embeddings and linears; norms are 1 + N(0, 0.1)
  std::string dtype = "float32"; // float32 | bfloat16 | float16
  RopeJsonForm rope_form = RopeJsonForm::kRopeScaling;
  uint64_t max_shard_bytes = 0;  // 0: one model.safetensors; else shards of at most this size
  // The linear weights as transformers saves a bitsandbytes 4-bit model (NF4, double
  // quantization, blocks of 64): six keys per Linear and a quantization_config in config.json.
  // Their values are random codes and block scales (weights within about +-0.06), not the
  // quantization of a normal draw, so that a 70B-shaped folder is written in the time it takes
  // to write its 36 GB; the other tensors as above in `dtype`.
  bool bnb_nf4 = false;
};

absl::Status MakeTinyModel(const std::string& dir, const TinyModelOptions& options);

}  // namespace qlora::engine
