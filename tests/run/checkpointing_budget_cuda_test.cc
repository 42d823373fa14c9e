// trainer.enable_gradient_checkpointing: auto on a GPU: a small NF4 model with LoRA on every
// linear layer, a budget halfway between what every layer checkpointed and none need; the plan
// checkpoints some layers, and a real step's peak allocation stays under the budget and near the
// plan. Skipped without a CUDA device.
#include <cstdio>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>

#include "tests/util/temp_dir.h"
#include "worker/engine/causal_lm_loss.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/memory_plan.h"
#include "worker/engine/tiny_model.h"
#include "worker/run/checkpointing_budget.h"
#include "worker/run/device_memory.h"

namespace qlora::worker {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(CheckpointingBudgetCuda, AStepStaysUnderTheBudgetAndNearThePlan) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  testing::TempDir tmp;
  engine::TinyModelOptions tiny;
  engine::LlamaConfig& shape = tiny.config;
  shape.vocab_size = 8192;
  shape.hidden_size = 1024;
  shape.intermediate_size = 2816;
  shape.num_hidden_layers = 8;
  shape.num_attention_heads = 16;
  shape.num_key_value_heads = 4;
  shape.head_dim = 64;
  shape.max_position_embeddings = 2048;
  tiny.dtype = "bfloat16";
  ASSERT_TRUE(engine::MakeTinyModel(tmp / "model", tiny).ok());
  engine::LoadOptions load;
  load.device = cuda;
  auto model = engine::LoadLlama(tmp / "model", load);
  ASSERT_TRUE(model.ok()) << model.status();
  engine::LoraOptions lora;
  lora.r = 16;
  lora.target_modules = {"all-linear"};
  ASSERT_TRUE((*model)->AddLora(lora).ok());
  (*model)->SetTraining(true);
  int64_t trainable = 0;
  for (const auto& [name, p] : (*model)->TrainableParameters()) trainable += p.numel();

  JobConfig config;
  config.trainer.batch_size = 4;
  config.data.max_sequence_length = 1024;
  config.trainer.gradient_checkpointing = CheckpointingMode::kAuto;
  CheckpointingBudgetOptions o;
  o.config = &config;
  o.model = model->get();
  o.device = cuda;
  o.trainable_elements = trainable;
  o.allocated_bytes = DeviceAllocatedBytes(cuda);
  o.peak_bytes = PeakMemoryBytes(cuda);
  // The budget: halfway between all and none checkpointed, as the plan sees them.
  engine::MemoryPlanRequest r;
  r.model = (*model)->config();
  r.micro_batch = 4;
  r.sequence_length = 1024;
  r.lora_r = 16;
  r.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  r.trainable_elements = trainable;
  r.resident_bytes = o.allocated_bytes;
  const int64_t all = engine::PlannedPeakBytes(r, 8), none = engine::PlannedPeakBytes(r, 0);
  config.trainer.max_memory_gib = static_cast<double>(all + none) / 2 / 0.92 / kGiB;
  auto budget = CheckpointingBudget::Start(o);
  ASSERT_TRUE(budget.ok()) << budget.status();
  const CheckpointingReport plan = budget->Report();
  printf("%s (all: %s, none: %s)\n", budget->Describe().c_str(), engine::FormatMemory(all).c_str(),
         engine::FormatMemory(none).c_str());
  EXPECT_GT(plan.checkpointed_layers, 0);
  EXPECT_LT(plan.checkpointed_layers, 8);

  c10::cuda::CUDACachingAllocator::resetPeakStats(cuda.index());
  at::manual_seed(0);
  const at::Tensor ids = at::randint(shape.vocab_size, {4, 1024}, at::dtype(at::kLong).device(cuda));
  const at::Tensor hidden = (*model)->Forward(ids);
  engine::CausalLmLoss loss = engine::ComputeCausalLmLoss(hidden, (*model)->lm_head, ids);
  (loss.loss_sum / static_cast<double>(loss.num_tokens)).backward();
  c10::cuda::device_synchronize();
  const int64_t measured = PeakMemoryBytes(cuda);
  printf("measured peak %s, planned %s, budget %s\n", engine::FormatMemory(measured).c_str(),
         engine::FormatMemory(plan.planned_peak_bytes).c_str(),
         engine::FormatMemory(plan.budget_bytes).c_str());
  EXPECT_LE(measured, plan.budget_bytes);
  EXPECT_GE(measured, plan.planned_peak_bytes * 7 / 10) << "the plan overestimates by > 30%";
  EXPECT_LE(measured, plan.planned_peak_bytes * 11 / 10) << "the plan underestimates by > 10%";
  // The worker's correction reads the same peak: within the plan, nothing changes.
  const std::string line = budget->AfterStep(1, measured);
  printf("%s\n", line.c_str());
  if (measured <= plan.planned_peak_bytes) {
    EXPECT_EQ(budget->Report().checkpointed_layers, plan.checkpointed_layers);
  }
}

}  // namespace
}  // namespace qlora::worker
