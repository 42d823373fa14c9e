// The shapes the plan tests share (activation_plan_test.cc, activation_offload_plan_test.cc).
#pragma once

#include <cstdint>
#include <iterator>

#include "worker/memory/activation_plan.h"

namespace qlora::memory {

inline constexpr int64_t kGiB = int64_t{1} << 30;

// LLaMA-2-7B (the LlamaConfig defaults), the benchmark job (bench/bench_job.yaml): micro-batch 4,
// sequence 2048, bf16, LoRA r 16 on all linear layers without dropout; resident 4.5 GB: the NF4
// base with double quantization (3.34 GB), bf16 embeddings and head (0.52 GB), the adapters'
// 40.0 M fp32 elements (the ZeRO flat buffer), AdamW state and gradient buffer (0.64 GB).
inline memory::ActivationPlanRequest SevenB(int64_t budget_gib) {
  memory::ActivationPlanRequest r;
  r.micro_batch = 4;
  r.sequence_length = 2048;
  r.dtype_bytes = 2;
  r.lora_r = 16;
  r.lora_targets = {std::begin(kProjectionNames), std::end(kProjectionNames)};
  r.trainable_elements = 39976960;
  r.built_bytes = 4500000000;
  r.budget_bytes = budget_gib * kGiB;
  return r;
}

// The benchmark's 70B-width slice (bench/make_llama_folder.py --layers 6 --hidden 8192
// --intermediate 28672 --heads 64) at `micro_batch` x 2048, the same adapters.
inline memory::ActivationPlanRequest SeventyBSlice(int64_t micro_batch) {
  memory::ActivationPlanRequest r = SevenB(24);
  r.model.hidden_size = 8192;
  r.model.intermediate_size = 28672;
  r.model.num_hidden_layers = 6;
  r.model.num_attention_heads = r.model.num_key_value_heads = 64;
  r.model.head_dim = 128;
  r.micro_batch = micro_batch;
  return r;
}

// The 7B shape at micro-batch 1 over one row of `tokens` (the longest-row benchmark) on a GPU
// (fused norms), with an 80 GB card's budget.
inline memory::ActivationPlanRequest SevenBRow(int64_t tokens) {
  memory::ActivationPlanRequest r = SevenB(74);
  r.micro_batch = 1;
  r.sequence_length = tokens;
  r.fused_norms = true;
  return r;
}

// The LLaMA-3.1-8B shape (vocabulary 128,256, 8 KV heads, intermediate 14,336) at micro-batch 1
// over one row of `tokens` on a GPU, as the longest-row benchmark ran it on an H100
// (bench/reports/longest-row_h100_2026-12-07.md): the same adapters (41.9 M elements), 5.68 GB
// held before the step (the pre-quantized NF4 base, bf16 head, adapters, AdamW state), a 76 GiB
// budget.
inline memory::ActivationPlanRequest EightBRow(int64_t tokens) {
  memory::ActivationPlanRequest r = SevenBRow(tokens);
  r.model.intermediate_size = 14336;
  r.model.num_key_value_heads = 8;
  r.model.vocab_size = 128256;
  r.trainable_elements = 41943040;
  r.built_bytes = 5679164928;
  r.budget_bytes = 76 * kGiB;
  return r;
}

}  // namespace qlora::memory
