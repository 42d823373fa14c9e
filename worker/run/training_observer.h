// What a test (or a future profiler) may watch of a training run without changing it: the model
// once its LoRA weights are initialised, and every micro-batch as the step that uses it trains
// on it. Called on the rank's own thread; the run waits for each call. Torch side.
#pragma once

#include <cstdint>
#include <string>

#include "worker/engine/llama_model.h"
#include "worker/run/micro_batches.h"

namespace qlora::worker {

class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // After AddLora, before the strategy makes every rank start from rank 0's weights.
  virtual void OnLoraReady(const engine::LlamaForCausalLM& model) { (void)model; }
  // Micro-batch `index` (0-based) of optimizer step `step` (0-based), before its forward pass.
  virtual void OnMicroBatch(int64_t step, int index, const DeviceBatch& batch) {
    (void)step, (void)index, (void)batch;
  }
  // Before this rank writes its part of the checkpoint of optimizer step `step` (1-based) into `dir`.
  virtual void OnCheckpointSave(int64_t step, const std::string& dir) { (void)step, (void)dir; }
};

}  // namespace qlora::worker
