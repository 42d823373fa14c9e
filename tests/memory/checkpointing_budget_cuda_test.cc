// trainer.enable_gradient_checkpointing: auto on a GPU: a small bf16 model with LoRA on every
// linear layer, a budget halfway between what every layer checkpointed and none need; the plan
// checkpoints some layers, and a real step's peak allocation stays under the budget and near the
// plan. And offload_activation_layers: auto: the GPU's rates measured, the choice the offload
// plan makes for them, and a real step with it. Skipped without a CUDA device.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/temp_dir.h"
#include "worker/engine/causal_lm_loss.h"
#include "worker/engine/hf_loader.h"
#include "worker/memory/activation_plan.h"
#include "worker/engine/offload_rates.h"
#include "worker/engine/tiny_model.h"
#include "worker/memory/checkpointing_budget.h"
#include "worker/memory/device_memory.h"
#include "worker/memory/host_memory.h"

namespace qlora::worker {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A small bf16 model with LoRA r 16 on every linear layer, on the GPU.
struct SmallModel {
  engine::LlamaConfig shape;
  std::unique_ptr<engine::LlamaForCausalLM> model;
  int64_t trainable = 0;
};

SmallModel MakeSmallModel(const testing::TempDir& tmp, const at::Device& cuda) {
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
  SmallModel m;
  m.shape = shape;
  EXPECT_TRUE(engine::MakeTinyModel(tmp / "model", tiny).ok());
  engine::LoadOptions load;
  load.device = cuda;
  auto model = engine::LoadLlama(tmp / "model", load);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return m;
  m.model = std::move(*model);
  engine::LoraOptions lora;
  lora.r = 16;
  lora.target_modules = {"all-linear"};
  EXPECT_TRUE(m.model->AddLora(lora).ok());
  m.model->SetTraining(true);
  for (const auto& [name, p] : m.model->TrainableParameters()) m.trainable += p.numel();
  return m;
}

// One forward and backward of 4 x 1024 random tokens; the allocator's peak during it.
int64_t StepPeak(engine::LlamaForCausalLM& model, const engine::LlamaConfig& shape,
                 const at::Device& cuda) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(cuda.index());
  at::manual_seed(0);
  const at::Tensor ids = at::randint(shape.vocab_size, {4, 1024}, at::dtype(at::kLong).device(cuda));
  const at::Tensor hidden = model.Forward(ids);
  engine::CausalLmLoss loss = engine::ComputeCausalLmLoss(hidden, model.lm_head, ids);
  (loss.loss_sum / static_cast<double>(loss.num_tokens)).backward();
  c10::cuda::device_synchronize();
  return memory::PeakMemoryBytes(cuda);
}

// A 4 x 1024 job with `mode` and Start()'s options for the model as it is now (its allocation
// counted as resident).
struct BudgetSetup {
  JobConfig config;
  memory::CheckpointingBudgetOptions options;
  memory::ActivationPlanRequest request;  // the plan's view of the same step, without a budget
};

std::unique_ptr<BudgetSetup> SetUpBudget(const SmallModel& small, const at::Device& cuda,
                                         CheckpointingMode mode) {
  auto b = std::make_unique<BudgetSetup>();
  b->config.trainer.batch_size = 4;
  b->config.data.max_sequence_length = 1024;
  b->config.trainer.gradient_checkpointing = mode;
  memory::CheckpointingBudgetOptions& o = b->options;
  o.config = &b->config;
  o.model = small.model.get();
  o.device = cuda;
  o.trainable_elements = small.trainable;
  o.allocated_bytes = memory::DeviceAllocatedBytes(cuda);
  o.available_bytes = memory::DeviceAvailableBytes(cuda);  // as the trainer gives it
  o.peak_bytes = memory::PeakMemoryBytes(cuda);
  memory::ActivationPlanRequest& r = b->request;
  r.model = small.shape;
  r.micro_batch = 4;
  r.sequence_length = 1024;
  r.lora_r = 16;
  r.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  r.trainable_elements = small.trainable;
  r.built_bytes = o.allocated_bytes;
  r.fused_norms = true;  // on CUDA the norms are fused nodes (as the budget's own request says)
  return b;
}

// max_memory_gib halfway between every layer and none checkpointed, as the plan sees them.
void BudgetHalfway(BudgetSetup& b) {
  const int64_t layers = b.request.model.num_hidden_layers;
  const int64_t all = memory::PlannedPeakBytes(b.request, layers);
  const int64_t none = memory::PlannedPeakBytes(b.request, 0);
  b.config.trainer.max_memory_gib = static_cast<double>(all + none) / 2 / 0.92 / kGiB;
}

// Each test: the small model on the first GPU (skipped without one).
class CheckpointingBudgetCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
    small_ = MakeSmallModel(tmp_, cuda_);
    ASSERT_NE(small_.model, nullptr);
  }

  const at::Device cuda_ = at::Device(at::kCUDA, 0);
  testing::TempDir tmp_;
  SmallModel small_;
};

TEST_F(CheckpointingBudgetCuda, AStepStaysUnderTheBudgetAndNearThePlan) {
  const at::Device& cuda = cuda_;
  const SmallModel& small = small_;
  const engine::LlamaConfig& shape = small.shape;
  engine::LlamaForCausalLM* model = small.model.get();

  std::unique_ptr<BudgetSetup> setup = SetUpBudget(small, cuda, CheckpointingMode::kAuto);
  BudgetHalfway(*setup);
  const int64_t all = memory::PlannedPeakBytes(setup->request, 8);
  const int64_t none = memory::PlannedPeakBytes(setup->request, 0);
  auto budget = memory::CheckpointingBudget::Start(setup->options);
  ASSERT_TRUE(budget.ok()) << budget.status();
  const CheckpointingReport plan = budget->Report();
  printf("%s (all: %s, none: %s)\n", budget->Describe().c_str(), memory::FormatMemory(all).c_str(),
         memory::FormatMemory(none).c_str());
  EXPECT_GT(plan.checkpointed_layers, 0);
  EXPECT_LT(plan.checkpointed_layers, 8);

  const int64_t measured = StepPeak(*model, shape, cuda);
  printf("measured peak %s, planned %s, budget %s\n", memory::FormatMemory(measured).c_str(),
         memory::FormatMemory(plan.planned_peak_bytes).c_str(),
         memory::FormatMemory(plan.budget_bytes).c_str());
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

// offload_activation_layers: auto on a GPU: the rates are measured on this GPU, the choice is
// what the plan allows for them (true: among the checkpointed layers; auto: the budget's plan
// that recomputes the fewest layers), reported and said, and a step with it stays in the budget.
TEST_F(CheckpointingBudgetCuda, OffloadAutoChoosesFromMeasuredRates) {
  const at::Device& cuda = cuda_;
  const SmallModel& small = small_;
  engine::LlamaForCausalLM& model = *small.model;

  engine::OffloadRateOptions measure;
  measure.device = cuda;
  measure.model = small.shape;
  measure.tokens = 4 * 1024;
  measure.host_bytes = memory::HostAvailableBytes() / 2;
  const absl::StatusOr<memory::OffloadRates> rates = engine::MeasureOffloadRates(measure);
  ASSERT_TRUE(rates.ok()) << rates.status();
  printf("host link %.1f GB/s, GEMMs %.0f TFLOP/s, host %.1f GiB\n", rates->host_link_bytes_per_s / 1e9,
         rates->gemm_flops_per_s / 1e12, static_cast<double>(rates->host_bytes) / kGiB);
  EXPECT_GT(rates->host_link_bytes_per_s, 1e9);
  EXPECT_GT(rates->gemm_flops_per_s, 1e12);
  EXPECT_GT(rates->host_bytes, 0);
  // A hundred times the measured link: these small layers' forward is short, so only a fast
  // link gives them a layer to offload.
  memory::OffloadRates generous = *rates;
  generous.host_link_bytes_per_s *= 100;

  for (const CheckpointingMode mode : {CheckpointingMode::kAll, CheckpointingMode::kAuto}) {
    std::unique_ptr<BudgetSetup> setup = SetUpBudget(small, cuda, mode);
    setup->config.trainer.offload_activation_auto = true;
    setup->options.offload_rates = absl::StatusOr<memory::OffloadRates>(generous);
    if (mode == CheckpointingMode::kAuto) BudgetHalfway(*setup);
    memory::ActivationPlanRequest& r = setup->request;
    auto budget = memory::CheckpointingBudget::Start(setup->options);
    ASSERT_TRUE(budget.ok()) << budget.status();
    printf("%s\n", budget->Describe().c_str());
    const CheckpointingReport chosen = budget->Report();
    EXPECT_EQ(chosen.offloaded_layers, model.offloaded_layers());
    EXPECT_THAT(budget->Describe(), ::testing::HasSubstr("(auto: host link "));
    if (mode == CheckpointingMode::kAll) {  // as many of the checkpointed ones as the link carries
      EXPECT_EQ(chosen.offloaded_layers,
                std::min(memory::OffloadableLayers(r, chosen.checkpointed_layers, generous),
                         std::min<int64_t>(chosen.checkpointed_layers, 7)));
    } else {
      r.budget_bytes = chosen.budget_bytes;
      const absl::StatusOr<memory::OffloadedPlan> plan =
          memory::PlanCheckpointingWithOffload(r, generous);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(chosen.offloaded_layers, plan->offloaded_layers);
      EXPECT_EQ(chosen.checkpointed_layers, plan->memory.checkpointed_layers);
      // Fewer layers recomputed than the plan without offloading checkpoints.
      const absl::StatusOr<memory::ActivationPlan> alone = memory::PlanCheckpointing(r);
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_LT(chosen.checkpointed_layers -
                    std::min(chosen.offloaded_layers, std::min<int64_t>(chosen.checkpointed_layers, 7)),
                alone->checkpointed_layers);
    }
    EXPECT_GT(chosen.offloaded_layers, 0);
    const int64_t measured = StepPeak(model, small.shape, cuda);
    printf("measured peak %s\n", memory::FormatMemory(measured).c_str());
    if (mode == CheckpointingMode::kAuto) EXPECT_LE(measured, chosen.budget_bytes);
  }

  // Without checkpointing nothing is recomputed: nothing offloaded, whatever the rates.
  std::unique_ptr<BudgetSetup> none = SetUpBudget(small, cuda, CheckpointingMode::kNone);
  none->config.trainer.offload_activation_auto = true;
  none->options.offload_rates = absl::StatusOr<memory::OffloadRates>(generous);
  auto plain = memory::CheckpointingBudget::Start(none->options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(model.offloaded_layers(), 0);
  EXPECT_THAT(plain->Describe(),
              ::testing::HasSubstr("; offload_activation_layers: auto: none (no layer is recomputed)"));
  // A measurement that fails leaves offloading off and says why; the job goes on.
  std::unique_ptr<BudgetSetup> failing = SetUpBudget(small, cuda, CheckpointingMode::kAll);
  failing->config.trainer.offload_activation_auto = true;
  failing->options.offload_rates =
      absl::StatusOr<memory::OffloadRates>(absl::ResourceExhaustedError("no pinned memory"));
  auto unmeasured = memory::CheckpointingBudget::Start(failing->options);
  ASSERT_TRUE(unmeasured.ok()) << unmeasured.status();
  EXPECT_EQ(model.offloaded_layers(), 0);
  EXPECT_EQ(unmeasured->Report().offloaded_layers, 0);
  EXPECT_THAT(unmeasured->Describe(),
              ::testing::HasSubstr("; offload_activation_layers: auto: none (the host link could "
                                   "not be measured: no pinned memory)"));
}

}  // namespace
}  // namespace qlora::worker
