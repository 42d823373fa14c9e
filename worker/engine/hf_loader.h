// Loads a local Hugging Face LLaMA folder (config.json + model.safetensors or a sharded index)
// into a LlamaForCausalLM, streaming: each tensor is read from the memory-mapped file, converted
// to the compute dtype on the target device, quantized to 4 bits if it is a linear layer's
// weight, and dropped (its file pages evicted) before the next one, so host memory stays near
// one tensor. Checkpoints already quantized by bitsandbytes (six keys per Linear and a
// `quantization_config`) load as they are.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "kernels/quantize_4bit.h"
#include "worker/engine/base_weight_store.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {

struct LoadOptions {
  bool quantize = true;  // quantize linear layers (ignored for pre-quantized checkpoints)
  kernels::QuantType quant_type = kernels::QuantType::kNF4;
  bool double_quant = true;
  int64_t blocksize = 64;
  at::ScalarType compute_dtype = at::kBFloat16;
  at::Device device = at::kCPU;
  // Where the decoder layers' frozen weights go (partitioned, or in host memory): each layer's
  // are handed over as soon as they are read, so the device never holds the whole model. Null:
  // they stay in the model's layers.
  std::shared_ptr<BaseWeightStore> base_weights;
  // An untied input embedding table on a CUDA device stays in pinned host memory instead
  // (LlamaForCausalLM::EmbedTokens); tied, it is lm_head's too and goes to the device.
  bool input_embedding_in_host_memory = false;
  // The decoder's 4-bit weights run their forward GEMMs in FP8 (float8_forward.h). Needs the
  // bfloat16 compute dtype and a Hopper GPU (or the CPU, emulated): else an error.
  bool float8_base_forward = false;
};

// NotFound when the folder lacks config.json or weights; InvalidArgument when tensors are
// missing, unexpected or of the wrong shape (the message names them); Unimplemented for
// unsupported configs; FailedPrecondition when quantization is asked for but the build has no
// 4-bit kernels.
absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> LoadLlama(const std::string& dir,
                                                             const LoadOptions& options);

// Process-wide, for main(): fixes glibc's mmap threshold at 1 MiB so that large freed host
// blocks go back to the OS at once. Without it glibc raises the threshold after the first large
// free and serves the loader's per-tensor temporaries from the heap, which then fragments to a
// good part of the checkpoint's size (measured: 90 MiB peak growth for a 130 MiB checkpoint,
// 32 MiB with this setting). Call once, before loading.
void UseMmapForLargeHostAllocations();

}  // namespace qlora::engine
