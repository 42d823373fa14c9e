// trainer.enable_gradient_checkpointing: true on the CPU, no weights needed: the top layer runs
// plainly exactly when the plan shows its recomputation would not lower the peak (backward
// recomputes it first thing); otherwise every layer is checkpointed.
#include <algorithm>
#include <iostream>
#include <limits>
#include <string>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/engine/llama_model.h"
#include "absl/status/status.h"
#include "worker/memory/activation_plan.h"
#include "worker/engine/tiny_model.h"
#include "worker/memory/checkpointing_budget.h"

namespace qlora::worker {
namespace {

engine::LlamaConfig Llama2_7bShape() {
  engine::LlamaConfig c = engine::TinyLlamaConfig();
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.intermediate_size = 11008;
  c.num_hidden_layers = 32;
  c.num_attention_heads = c.num_key_value_heads = 32;
  c.head_dim = 128;
  c.max_position_embeddings = 4096;
  return c;
}

struct Chosen {
  int64_t checkpointed = 0;
  int64_t offloaded = 0;
  bool has_offloader = false;
  std::string describe;
  int64_t peak_all = 0, peak_all_but_top = 0;
};

// Start() for `true` on a weightless model of `shape` (its layers hold no tensors), 7 GiB
// counted as resident, with the planner's figures for all and all-but-the-top checkpointed.
Chosen ChooseForTrue(const engine::LlamaConfig& shape, int64_t micro_batch, int64_t sequence,
                     int64_t offload_activation_layers = 0, bool offload_auto = false) {
  engine::LlamaForCausalLM model(shape, at::kBFloat16, at::Device(at::kCPU));
  JobConfig config;
  config.trainer.batch_size = micro_batch;
  config.data.max_sequence_length = sequence;
  config.trainer.gradient_checkpointing = CheckpointingMode::kAll;
  config.trainer.offload_activation_layers = offload_activation_layers;
  config.trainer.offload_activation_auto = offload_auto;
  memory::CheckpointingBudgetOptions o;
  o.config = &config;
  o.model = &model;
  // Rates as a GPU would have them: a CPU worker must not use them.
  o.offload_rates = absl::StatusOr<memory::OffloadRates>(
      memory::OffloadRates{55e9, 700e12, int64_t{100} << 30});
  o.allocated_bytes = int64_t{7} << 30;
  auto budget = memory::CheckpointingBudget::Start(o);
  EXPECT_TRUE(budget.ok()) << budget.status();
  Chosen c;
  if (!budget.ok()) return c;
  c.checkpointed = model.checkpointed_layers();
  c.offloaded = model.offloaded_layers();
  c.has_offloader = model.activation_offloader() != nullptr;
  c.describe = budget->Describe();
  memory::ActivationPlanRequest r;
  r.model = shape;
  r.micro_batch = micro_batch;
  r.sequence_length = sequence;
  r.built_bytes = o.allocated_bytes;
  c.peak_all = memory::PlannedPeakBytes(r, shape.num_hidden_layers);
  c.peak_all_but_top = memory::PlannedPeakBytes(r, shape.num_hidden_layers - 1);
  return c;
}

TEST(CheckpointingBudget, TrueRunsTheTopLayerPlainlyWhenThatCostsNoMemory) {
  // 7B at 4 x 2048: the top layer's recompute-and-backward sets the peak, so it runs plainly.
  const Chosen wide = ChooseForTrue(Llama2_7bShape(), 4, 2048);
  EXPECT_LE(wide.peak_all_but_top, wide.peak_all);
  EXPECT_EQ(wide.checkpointed, 31);
  EXPECT_THAT(wide.describe, ::testing::HasSubstr("31 of 32 layers checkpointed"));
  EXPECT_THAT(wide.describe, ::testing::HasSubstr("the top layer runs plainly"));

  // A large vocabulary over a narrow model: the loss's backward sets the peak, where a plain top
  // layer's activations would still be held, so every layer is checkpointed.
  engine::LlamaConfig narrow = Llama2_7bShape();
  narrow.hidden_size = 256;
  narrow.intermediate_size = 512;
  narrow.num_attention_heads = narrow.num_key_value_heads = 4;
  narrow.head_dim = 64;
  narrow.vocab_size = 256000;
  const Chosen loss_bound = ChooseForTrue(narrow, 4, 2048);
  EXPECT_GT(loss_bound.peak_all_but_top, loss_bound.peak_all);
  EXPECT_EQ(loss_bound.checkpointed, 32);
  EXPECT_THAT(loss_bound.describe, ::testing::HasSubstr("32 of 32 layers checkpointed "
                                                        "(enable_gradient_checkpointing: true)"));
}

// trainer.offload_activation_layers moves activations between a GPU and host memory: a CPU
// worker ignores it and says so.
TEST(CheckpointingBudget, OffloadingOnACpuWorkerIsIgnoredAndSaidSo) {
  const Chosen c = ChooseForTrue(Llama2_7bShape(), 1, 512, /*offload_activation_layers=*/8);
  EXPECT_EQ(c.offloaded, 0);
  EXPECT_FALSE(c.has_offloader);
  EXPECT_THAT(c.describe,
              ::testing::HasSubstr("; offload_activation_layers: 8 ignored: the model is not on a GPU"));
  const Chosen automatic = ChooseForTrue(Llama2_7bShape(), 1, 512, 0, /*offload_auto=*/true);
  EXPECT_EQ(automatic.offloaded, 0);
  EXPECT_FALSE(automatic.has_offloader);
  EXPECT_THAT(automatic.describe, ::testing::HasSubstr(
                                      "; offload_activation_layers: auto ignored: the model is "
                                      "not on a GPU"));
}

// A 7B-shaped weightless model at micro-batch 4 x 2048 with 7 GiB counted as resident, and the
// options that start a budget for it under `config` (set here to that shape; the caller adds the
// trainer's choices before Start).
struct SevenBBudget {
  engine::LlamaForCausalLM model{Llama2_7bShape(), at::kBFloat16, at::Device(at::kCPU)};
  JobConfig config;
  memory::CheckpointingBudgetOptions options;
  SevenBBudget() {
    config.trainer.batch_size = 4;
    config.data.max_sequence_length = 2048;
    options.config = &config;
    options.model = &model;
    options.allocated_bytes = int64_t{7} << 30;
  }
};

// The room dequantized_weight_layers: auto leaves for an offloaded layer in transit: the plan's
// bytes of a plain 7B layer at micro-batch 4 x 2048, which round 22 saw as the step's peak rising
// 0.7-0.9 GiB over the first step's plus the dequantized layers with 8 or 10 plain layers offloaded.
TEST(CheckpointingBudget, AnOffloadedLayerInTransitIsAPlainLayersSavedTensors) {
  memory::ActivationPlanRequest r;
  r.model = Llama2_7bShape();
  r.micro_batch = 4;
  r.sequence_length = 2048;
  r.dtype_bytes = 2;
  r.lora_r = 16;
  r.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const int64_t bytes = memory::CheckpointingBudget::OffloadedLayerBytes(r);
  EXPECT_EQ(bytes, memory::PerTokenLayerBytes(r).plain * 4 * 2048);
  std::cout << "a plain 7B layer's saved tensors at micro-batch 4 x 2048: " << (bytes >> 20)
            << " MiB\n";
  EXPECT_GT(bytes, int64_t{700} << 20);
  EXPECT_LT(bytes, int64_t{1} << 30);

  // Nothing offloaded (a CPU worker ignores the count): no room set aside.
  SevenBBudget b;
  b.config.trainer.gradient_checkpointing = CheckpointingMode::kNone;
  b.config.trainer.offload_activation_layers = 10;
  auto budget = memory::CheckpointingBudget::Start(b.options);
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_EQ(b.model.offloaded_layers(), 0);
  EXPECT_EQ(budget->OffloadedLayerBytes(), 0);
}

// A row of 100,000 tokens under 51 GiB: every layer's input fits, but not beside one layer's
// whole MLP recomputed: the plan tiles the MLPs, the model runs them so, and the log says it.
TEST(CheckpointingBudget, AutoTilesTheMlpsOfRowsTooLongForWholeOnes) {
  SevenBBudget b;
  b.config.trainer.batch_size = 1;
  b.config.data.max_sequence_length = 100000;
  b.config.trainer.gradient_checkpointing = CheckpointingMode::kAuto;
  b.config.trainer.max_memory_gib = 51;  // whole MLPs need 52.1
  auto budget = memory::CheckpointingBudget::Start(b.options);
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_EQ(b.model.mlp_tile_rows(), memory::kMlpTileRows);
  EXPECT_THAT(budget->Describe(), ::testing::HasSubstr("(their MLPs in tiles of 8192 rows)"));
  // A plan that fits whole MLPs, then a step above it: from the next step, tiles (they lower
  // the peak at the same split).
  b.config.trainer.max_memory_gib = 53;  // whole MLPs need 52.1
  auto corrected = memory::CheckpointingBudget::Start(b.options);
  ASSERT_TRUE(corrected.ok()) << corrected.status();
  EXPECT_EQ(b.model.mlp_tile_rows(), 0);
  const int64_t planned = corrected->Report().planned_peak_bytes;
  EXPECT_THAT(corrected->AfterStep(1, planned + (int64_t{2} << 30)),
              ::testing::HasSubstr("so from the next step: activation checkpointing: 32 of 32 layers "
                                   "checkpointed (their MLPs in tiles of 8192 rows)"));
  EXPECT_EQ(b.model.mlp_tile_rows(), memory::kMlpTileRows);
  EXPECT_LT(corrected->Report().planned_peak_bytes, planned + (int64_t{2} << 30));
  // Rows that fit whole stay whole.
  b.config.trainer.max_memory_gib = 51;
  b.config.data.max_sequence_length = 4096;
  auto whole = memory::CheckpointingBudget::Start(b.options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(b.model.mlp_tile_rows(), 0);
}

// enable_gradient_checkpointing: auto under 24 GiB for 7B at micro-batch 4 x 2048 on a weightless
// model (7 GiB counted as resident), with a step-1 peak 2 GiB above the plan: the plan counts the
// difference and checkpoints more layers. The allocator's peak is the process's, so step 2 reads
// step 1's again unless it went higher: that is no new miss (counting it twice checkpointed
// layers for nothing), while a higher one is.
TEST(CheckpointingBudget, AStepOnlyCountsWhereItPeakedAboveTheEarlierSteps) {
  SevenBBudget b;
  b.config.trainer.gradient_checkpointing = CheckpointingMode::kAuto;
  b.config.trainer.max_memory_gib = 24;
  engine::LlamaForCausalLM& model = b.model;
  auto budget = memory::CheckpointingBudget::Start(b.options);
  ASSERT_TRUE(budget.ok()) << budget.status();
  const int64_t planned = budget->Report().planned_peak_bytes;
  const int64_t first = model.checkpointed_layers();
  ASSERT_GT(first, 0);
  ASSERT_LT(first, 30);
  const int64_t step1 = planned + (int64_t{2} << 30);
  EXPECT_THAT(budget->AfterStep(1, step1), ::testing::HasSubstr("above the plan"));
  const int64_t second = model.checkpointed_layers();
  EXPECT_GT(second, first);
  EXPECT_EQ(budget->AfterStep(2, step1), "");  // step 1's peak again
  EXPECT_EQ(model.checkpointed_layers(), second);

  // What dequantized weights may add keeps the plan's 8 % margin: none after a step above it,
  // the plan's slack after one within the plan.
  const double allowed = 24.0 * (int64_t{1} << 30) * (1 - memory::ActivationPlanRequest().margin_fraction);
  EXPECT_GT(step1, allowed);
  EXPECT_EQ(budget->RoomForFixedBytes(step1), 0);
  const int64_t replanned = budget->Report().planned_peak_bytes;
  ASSERT_LE(replanned, allowed);
  const int64_t room = budget->RoomForFixedBytes(replanned - (int64_t{1} << 30));
  EXPECT_EQ(room, static_cast<int64_t>(allowed - static_cast<double>(replanned)));
  budget->AddFixedBytes(room);
  EXPECT_LE(budget->Report().planned_peak_bytes, allowed);
  // Step 2 a GiB above step 1: a new miss, counted.
  EXPECT_THAT(budget->AfterStep(2, step1 + (int64_t{1} << 30) + room), ::testing::HasSubstr("step 2"));

  // Checkpointing true or false plans nothing: no limit from it.
  b.config.trainer.gradient_checkpointing = CheckpointingMode::kNone;
  auto plain = memory::CheckpointingBudget::Start(b.options);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->RoomForFixedBytes(step1), std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace qlora::worker
