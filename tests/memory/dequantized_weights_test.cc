// trainer.dequantized_weight_layers on one rank (worker/memory/dequantized_weights.h), on a real
// tiny NF4 model on the CPU: a count holds that many first layers at once; auto waits for the
// first step's peak (the larger of the allocation's and the reservation's) and holds what fits
// the budget less 2 % (its arithmetic with the 7B figures, and the choice on the model), less one
// offloaded layer in transit where offloading is on; auto on a CPU worker holds none.
#include <stdlib.h>

#include <limits>
#include <string>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/engine/hf_loader.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/tiny_model.h"
#include "worker/memory/dequantized_weights.h"

namespace qlora::worker {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// A tiny NF4 model of 4 layers with adapters on every projection, in a fresh folder.
std::unique_ptr<engine::LlamaForCausalLM> TinyNf4Model() {
  char pattern[] = "/tmp/qlora_dequantized_XXXXXX";
  const char* dir = mkdtemp(pattern);
  EXPECT_NE(dir, nullptr);
  engine::TinyModelOptions tiny;
  tiny.config.num_hidden_layers = 4;
  EXPECT_TRUE(engine::MakeTinyModel(dir, tiny).ok());
  engine::LoadOptions load;
  load.compute_dtype = at::kBFloat16;
  auto model = engine::LoadLlama(dir, load);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  engine::LoraOptions lora;
  lora.target_modules = {"all-linear"};
  EXPECT_TRUE((*model)->AddLora(lora).ok());
  return std::move(*model);
}

// auto on a GPU worker with max_memory_gib: 1, for `model` (which stays on the CPU: only its
// bytes matter to the decision).
memory::DequantizedWeightsOptions GpuAutoWithinOneGiB(TrainerConfig& trainer,
                                                      engine::LlamaForCausalLM& model) {
  trainer.dequantized_weights_auto = true;
  trainer.max_memory_gib = 1;
  memory::DequantizedWeightsOptions o;
  o.trainer = &trainer;
  o.model = &model;
  o.device = c10::Device(c10::kCUDA, 0);
  return o;
}

TEST(DequantizedWeights, FittingLayersLeaveTwoPercentOfTheBudget) {
  // 7B at micro-batch 4 without checkpointing: a 31.65 GiB peak, 36 GiB allowed, ~0.4 GB a layer.
  const int64_t layer = int64_t{404} << 20;
  const int64_t peak = static_cast<int64_t>(31.65 * kGiB);
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(36 * kGiB, peak, layer, 32),
            static_cast<int64_t>((36 * kGiB * 0.98 - peak) / layer));
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(36 * kGiB, peak, layer, 32), 9);
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(140 * kGiB, peak, layer, 32), 32);  // all of them
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(32 * kGiB, peak, layer, 32), 0);    // no room
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(36 * kGiB, peak, 0, 32), 0);        // nothing 4-bit
  // Beside enable_gradient_checkpointing: auto, no more than the plan leaves (its 8 % margin
  // kept): here room for 3 layers, less one in transit.
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(36 * kGiB, peak, layer, 32, 0, 3 * layer + 1), 3);
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(36 * kGiB, peak, layer, 32, layer, 3 * layer + 1), 2);
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(36 * kGiB, peak, layer, 32, 0, 0), 0);
}

TEST(DequantizedWeights, ACountHoldsThatManyFirstLayersAtOnce) {
  auto model = TinyNf4Model();
  ASSERT_NE(model, nullptr);
  TrainerConfig trainer;
  trainer.dequantized_weight_layers = 3;
  memory::DequantizedWeightsOptions o;
  o.trainer = &trainer;
  o.model = model.get();
  std::string line;
  memory::DequantizedWeights d = memory::DequantizedWeights::Start(o, &line);
  EXPECT_EQ(model->dequantized_layers(), 3);
  EXPECT_TRUE(model->layers[0].q_proj.base.dequantized.defined());
  EXPECT_TRUE(model->layers[2].q_proj.base.dequantized.defined());
  EXPECT_FALSE(model->layers[3].q_proj.base.dequantized.defined());
  EXPECT_THAT(line, HasSubstr("3 of 4 layers hold their weights dequantized"));
  // A count never changes.
  EXPECT_EQ(d.AfterStep(1, {100 * kGiB, 100 * kGiB}, 0, kNoLimit, &line), 0);
  EXPECT_EQ(line, "");
  EXPECT_EQ(model->dequantized_layers(), 3);
}

TEST(DequantizedWeights, AutoHoldsWhatFitsAfterTheFirstStepOnAGpuAndNoneOnACpu) {
  auto model = TinyNf4Model();
  ASSERT_NE(model, nullptr);
  TrainerConfig trainer;
  trainer.dequantized_weights_auto = true;
  memory::DequantizedWeightsOptions o;
  o.trainer = &trainer;
  o.model = model.get();
  std::string line;
  memory::DequantizedWeights on_cpu = memory::DequantizedWeights::Start(o, &line);
  EXPECT_THAT(line, HasSubstr("auto: none (the model is not on a GPU)"));
  EXPECT_EQ(on_cpu.AfterStep(1, {}, 0, kNoLimit, &line), 0);
  EXPECT_EQ(model->dequantized_layers(), 0);

  // A GPU worker's decision (the model itself stays on the CPU: only its bytes matter here):
  // a budget with room for two layers past the first step's peak.
  const int64_t layer = model->DequantizedLayerBytes();
  ASSERT_GT(layer, 0);
  o.device = c10::Device(c10::kCUDA, 0);
  trainer.max_memory_gib = 1;
  const int64_t peak = static_cast<int64_t>(kGiB * 0.98) - 2 * layer - layer / 2;
  memory::DequantizedWeights on_gpu = memory::DequantizedWeights::Start(o, &line);
  EXPECT_THAT(line, HasSubstr("chosen after the first step, for a 1.0 GiB budget"));
  EXPECT_EQ(model->dequantized_layers(), 0);  // not before the first step
  EXPECT_EQ(on_gpu.AfterStep(1, {peak, peak}, 0, kNoLimit, &line), 2 * layer);
  EXPECT_EQ(model->dequantized_layers(), 2);
  EXPECT_THAT(line, HasSubstr("so from the next step 2 of 4 layers hold their weights"));
  EXPECT_EQ(on_gpu.AfterStep(2, {}, 0, kNoLimit, &line), 0);  // decided once
  EXPECT_EQ(model->dequantized_layers(), 2);
}

// The budget caps what the allocator reserves: layers are fitted against the peak reservation
// where fragments make it larger than the peak allocation (7B, no checkpointing, 34 GiB: fitted
// against 27.6 GiB allocated, step 7 ran out of memory with 1 GiB of fragments reserved).
TEST(DequantizedWeights, AutoFitsAgainstThePeakReservation) {
  auto model = TinyNf4Model();
  ASSERT_NE(model, nullptr);
  TrainerConfig trainer;
  const memory::DequantizedWeightsOptions o = GpuAutoWithinOneGiB(trainer, *model);
  const int64_t layer = model->DequantizedLayerBytes();
  // The allocation leaves room for 3.5 layers, the reservation 2 layers more than it for 1.5.
  const int64_t allocated = static_cast<int64_t>(kGiB * 0.98) - 3 * layer - layer / 2;
  std::string line;
  memory::DequantizedWeights d = memory::DequantizedWeights::Start(o, &line);
  EXPECT_EQ(d.AfterStep(1, {allocated, allocated + 2 * layer}, 0, kNoLimit, &line), layer);
  EXPECT_EQ(model->dequantized_layers(), 1);
  EXPECT_THAT(line, HasSubstr("reserved, of a 1.0 GiB budget"));
}

// With activation offloading on, a faster step lets copies lag further behind (round 22: the 7B
// step with 8 or 10 plain layers offloaded peaked 0.7-0.9 GiB over the first step's peak plus the
// dequantized layers), so auto also leaves the room it is given for one offloaded layer in transit.
TEST(DequantizedWeights, AutoLeavesTheRoomItIsGivenForAnOffloadedLayerInTransit) {
  auto model = TinyNf4Model();
  ASSERT_NE(model, nullptr);
  TrainerConfig trainer;
  const memory::DequantizedWeightsOptions o = GpuAutoWithinOneGiB(trainer, *model);
  const int64_t layer = model->DequantizedLayerBytes();
  // Room for 3.5 layers; a layer and a half in transit leaves room for 2.
  const int64_t peak = static_cast<int64_t>(kGiB * 0.98) - 3 * layer - layer / 2;
  std::string line;
  memory::DequantizedWeights d = memory::DequantizedWeights::Start(o, &line);
  d.AfterStep(1, {peak, peak}, layer + layer / 2, kNoLimit, &line);
  EXPECT_EQ(model->dequantized_layers(), 2);
  EXPECT_THAT(line, HasSubstr("for one more offloaded layer in transit"));
  EXPECT_EQ(memory::DequantizedWeights::FittingLayers(kGiB, peak, layer, 4), 3);  // without it
}

}  // namespace
}  // namespace qlora::worker
