// The shapes the plan tests share (memory_plan_test.cc, offload_plan_test.cc).
#pragma once

#include <cstdint>

#include "worker/engine/memory_plan.h"

namespace qlora::engine {

inline constexpr int64_t kGiB = int64_t{1} << 30;

// LLaMA-2-7B (the LlamaConfig defaults), the benchmark job (bench/bench_job.yaml): micro-batch 4,
// sequence 2048, bf16, LoRA r 16 on all linear layers without dropout; resident 4.5 GB: the NF4
// base with double quantization (3.34 GB), bf16 embeddings and head (0.52 GB), the adapters'
// 40.0 M fp32 elements (the ZeRO flat buffer), AdamW state and gradient buffer (0.64 GB).
inline MemoryPlanRequest SevenB(int64_t budget_gib) {
  MemoryPlanRequest r;
  r.micro_batch = 4;
  r.sequence_length = 2048;
  r.dtype_bytes = 2;
  r.lora_r = 16;
  r.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  r.trainable_elements = 39976960;
  r.resident_bytes = 4500000000;
  r.budget_bytes = budget_gib * kGiB;
  return r;
}

}  // namespace qlora::engine
