// Inputs for the engine's LoRA tests: random token ids, labels with a masked prompt, and
// non-zero B matrices (PEFT starts them at zero, which would hide every gradient but B's).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "common/model/llama_config.h"
#include "worker/engine/causal_lm_loss.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {

inline at::Tensor RandomIds(const LlamaConfig& c, int64_t batch, int64_t seq, uint64_t seed = 1) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {batch, seq}, gen, at::kLong);
}

inline void RandomizeLoraB(LlamaForCausalLM& model) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (const auto& [name, p] : model.TrainableParameters()) {
    if (name.find("lora_B") != std::string::npos) {
      const_cast<at::Tensor&>(p).copy_(at::randn(p.sizes(), gen) * 0.1);
    }
  }
}

inline at::Tensor LabelsFor(const at::Tensor& ids) {
  at::Tensor labels = ids.clone();
  labels.index_put_({0, at::indexing::Slice(0, 3)}, kIgnoreIndex);  // a masked prompt
  return labels;
}

}  // namespace qlora::engine
