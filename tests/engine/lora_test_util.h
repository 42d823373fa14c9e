// Inputs for the engine's LoRA tests: the devices to run on, a tiny bf16 model with adapters,
// random token ids, labels with a masked prompt, and non-zero B matrices (PEFT starts them at
// zero, which would hide every gradient but B's).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "common/model/llama_config.h"
#include "gtest/gtest.h"
#include "worker/engine/causal_lm_loss.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/llama_model.h"

namespace qlora::engine {

inline at::Tensor RandomIds(const LlamaConfig& c, int64_t batch, int64_t seq, uint64_t seed = 1) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(c.vocab_size, {batch, seq}, gen, at::kLong);
}

inline void RandomizeLoraB(LlamaForCausalLM& model, uint64_t seed = 7) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& [name, p] : model.TrainableParameters()) {
    if (name.find("lora_B") != std::string::npos) {
      const_cast<at::Tensor&>(p).copy_(at::randn(p.sizes(), gen) * 0.1);
    }
  }
}

// The CPU, and the first GPU when there is one.
inline std::vector<at::Device> TestDevices() {
  std::vector<at::Device> devices = {at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  return devices;
}

// The model folder at `dir` loaded on `device` in bf16 (its forward GEMMs in FP8 with
// float8_base_forward), with adapters on every linear layer (B randomized) and training on; null
// (and a test failure) when it does not load.
inline std::unique_ptr<LlamaForCausalLM> LoadBf16WithAdapters(const std::string& dir,
                                                              at::Device device,
                                                              double dropout = 0.0,
                                                              bool float8_base_forward = false) {
  LoadOptions options;
  options.device = device;
  options.compute_dtype = at::kBFloat16;
  options.float8_base_forward = float8_base_forward;
  auto loaded = LoadLlama(dir, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  std::unique_ptr<LlamaForCausalLM> model = std::move(*loaded);
  LoraOptions lora;
  lora.target_modules = {"all-linear"};
  lora.dropout = dropout;
  EXPECT_TRUE(model->AddLora(lora).ok());
  RandomizeLoraB(*model);
  model->SetTraining(true);
  return model;
}

inline at::Tensor LabelsFor(const at::Tensor& ids) {
  at::Tensor labels = ids.clone();
  labels.index_put_({0, at::indexing::Slice(0, 3)}, kIgnoreIndex);  // a masked prompt
  return labels;
}

// The losses of two micro-batches (ids, then ids reversed; "loss_sum_0", "loss_sum_1") and the
// adapters' gradients accumulated over both (by parameter name), on the CPU.
inline std::map<std::string, at::Tensor> TwoMicroBatchGradients(LlamaForCausalLM& model,
                                                                const at::Tensor& ids,
                                                                const at::Tensor& labels) {
  for (const auto& [name, p] : model.TrainableParameters()) p.mutable_grad() = at::Tensor();
  std::map<std::string, at::Tensor> out;
  for (int micro = 0; micro < 2; ++micro) {
    const at::Tensor hidden = model.Forward(micro == 0 ? ids : ids.flip(1));
    const CausalLmLoss loss = model.Loss(hidden, labels, {5});
    loss.loss_sum.backward();
    out["loss_sum_" + std::to_string(micro)] = loss.loss_sum.detach().cpu();
  }
  for (const auto& [name, p] : model.TrainableParameters()) out[name] = p.grad().cpu().clone();
  return out;
}

}  // namespace qlora::engine
