// The base-weight placement a job that leaves the ZeRO stage to the service gets
// (worker/memory/base_weight_plan.h): the bytes it counts against what the loader builds, and
// the first placement that fits the budget.
#include "worker/memory/base_weight_plan.h"

#include <iterator>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/memory/plan_shapes.h"

namespace qlora::memory {
namespace {

using ::testing::HasSubstr;

constexpr double kMiB = 1024.0 * 1024.0;

// LLaMA-2-70B (80 layers, hidden 8192, intermediate 28672, 64 heads, 8 KV heads).
LlamaConfig SeventyB() {
  LlamaConfig m;
  m.hidden_size = 8192;
  m.intermediate_size = 28672;
  m.num_hidden_layers = 80;
  m.num_attention_heads = 64;
  m.num_key_value_heads = 8;
  m.head_dim = 128;
  return m;
}

JobConfig BenchmarkJob(int micro_batch) {
  JobConfig job;
  job.trainer.batch_size = micro_batch;
  job.data.max_sequence_length = 2048;
  job.lora.r = 16;
  job.lora.dropout = 0;
  job.lora.target_modules = {std::begin(kProjectionNames), std::end(kProjectionNames)};
  return job;
}

BaseWeightPlanRequest Request(const LlamaConfig& model, int micro_batch, int world, double budget_gib) {
  const JobConfig job = BenchmarkJob(micro_batch);
  BaseWeightPlanRequest r;
  r.activations = ActivationRequestFor(job, model, /*cuda=*/true);
  r.quantization = job.quantization;
  r.world_size = world;
  r.budget_bytes = static_cast<int64_t>(budget_gib * kGiB);
  return r;
}

// The loader's figures for the 70B NF4 folder (its log on the GPU machine: "a layer made whole
// is 421.0 MiB", "33676.5 MiB in host memory" for the 80 layers); the embeddings and head in bf16.
TEST(BaseWeightPlanTest, CountsTheBytesTheLoaderBuilds) {
  const BaseWeightBytes b = FrozenWeightBytes(SeventyB(), QuantizationConfig{}, 2);
  EXPECT_NEAR(b.per_layer / kMiB, 421.0, 0.5);
  EXPECT_NEAR(b.per_layer * 80 / kMiB, 33676.5, 40);
  EXPECT_NEAR(b.outside / kMiB, 2 * 32000 * 8192 * 2 / kMiB, 4);
  // Unquantized: the bf16 weights, four times the codes and more.
  QuantizationConfig off;
  off.enabled = false;
  EXPECT_GT(FrozenWeightBytes(SeventyB(), off, 2).per_layer, 3.7 * b.per_layer);
}

// Training on a GPU keeps an untied input embedding table in host memory: the device holds
// lm_head alone; a tied table is lm_head and stays.
TEST(BaseWeightPlanTest, AnInputEmbeddingInHostMemoryIsNotCounted) {
  const double table = 32000.0 * 8192 * 2;
  const BaseWeightBytes both = FrozenWeightBytes(SeventyB(), QuantizationConfig{}, 2);
  const BaseWeightBytes host = FrozenWeightBytes(SeventyB(), QuantizationConfig{}, 2, true);
  EXPECT_EQ(host.per_layer, both.per_layer);
  EXPECT_EQ(both.outside - host.outside, table);
  LlamaConfig tied = SeventyB();
  tied.tie_word_embeddings = true;
  EXPECT_EQ(FrozenWeightBytes(tied, QuantizationConfig{}, 2, true).outside,
            FrozenWeightBytes(tied, QuantizationConfig{}, 2).outside);
  EXPECT_EQ(FrozenWeightBytes(tied, QuantizationConfig{}, 2).outside, host.outside);
  BaseWeightPlanRequest r = Request(SeventyB(), 1, 1, 24);
  const int64_t on_device = PlannedPeakWith(r, BaseWeightPlacement::kStreamed);
  r.input_embedding_on_host = true;
  EXPECT_EQ(on_device - PlannedPeakWith(r, BaseWeightPlacement::kStreamed), table);
}

TEST(BaseWeightPlanTest, TheAdaptersAreTheJobsTargets) {
  const ActivationPlanRequest r = ActivationRequestFor(BenchmarkJob(1), SeventyB(), true);
  EXPECT_EQ(r.trainable_elements, 207093760);  // what the 70B run's strategy reported
  EXPECT_EQ(r.micro_batch, 1);
  EXPECT_EQ(r.sequence_length, 2048);
  EXPECT_TRUE(r.fused_norms);
}

TEST(BaseWeightPlanTest, SevenBFitsOnEveryGpu) {
  const BaseWeightPlan plan = PlanBaseWeights(Request(LlamaConfig{}, 4, 1, 24));
  EXPECT_EQ(plan.zero_stage, 2);
  EXPECT_FALSE(plan.offload_param);
  EXPECT_EQ(plan.placement, BaseWeightPlacement::kOnDevice);
  EXPECT_LT(plan.planned_peak_bytes, 24 * kGiB);
  EXPECT_THAT(plan.reason, HasSubstr("stage 2, base weights on device"));
}

// 70B on one 24 GiB GPU: only streaming fits. On eight, the shards fit; the reason names what
// the placements passed over would need.
TEST(BaseWeightPlanTest, SeventyBStreamsOnOneGpuAndShardsOnEight) {
  const BaseWeightPlan one = PlanBaseWeights(Request(SeventyB(), 1, 1, 24));
  EXPECT_EQ(one.zero_stage, 3);
  EXPECT_TRUE(one.offload_param);
  EXPECT_EQ(one.placement, BaseWeightPlacement::kStreamed);
  EXPECT_LT(one.planned_peak_bytes, 0.92 * 24 * kGiB);
  EXPECT_THAT(one.reason, HasSubstr("streamed from host memory"));
  EXPECT_THAT(one.reason, HasSubstr("on device would need"));

  const BaseWeightPlan eight = PlanBaseWeights(Request(SeventyB(), 1, 8, 24));
  EXPECT_EQ(eight.zero_stage, 3);
  EXPECT_FALSE(eight.offload_param);
  EXPECT_EQ(eight.placement, BaseWeightPlacement::kSharded);
  EXPECT_THAT(eight.reason, HasSubstr("sharded across 8 ranks"));
  // An 80 GiB GPU holds the whole 4-bit model.
  EXPECT_EQ(PlanBaseWeights(Request(SeventyB(), 1, 1, 80)).placement, BaseWeightPlacement::kOnDevice);
}

TEST(BaseWeightPlanTest, EachPlacementNeedsLessThanTheOneBefore) {
  const BaseWeightPlanRequest r = Request(SeventyB(), 1, 2, 24);
  int64_t on_device = 0, sharded = 0, streamed = 0;
  const int64_t a = PlannedPeakWith(r, BaseWeightPlacement::kOnDevice, &on_device);
  const int64_t b = PlannedPeakWith(r, BaseWeightPlacement::kSharded, &sharded);
  const int64_t c = PlannedPeakWith(r, BaseWeightPlacement::kStreamed, &streamed);
  EXPECT_GT(a, b);
  EXPECT_GT(b, c);
  EXPECT_GT(on_device, sharded);
  EXPECT_GT(sharded, streamed);
}

TEST(BaseWeightPlanTest, NoBudgetKeepsStageTwo) {
  const BaseWeightPlan plan = PlanBaseWeights(Request(SeventyB(), 1, 1, 0));
  EXPECT_EQ(plan.zero_stage, 2);
  EXPECT_EQ(plan.placement, BaseWeightPlacement::kOnDevice);
  EXPECT_THAT(plan.reason, HasSubstr("no memory budget"));
}

// Nothing fits: the leanest placement, and the reason says it is over.
TEST(BaseWeightPlanTest, TooSmallABudgetStreamsAndSaysSo) {
  const BaseWeightPlan plan = PlanBaseWeights(Request(SeventyB(), 8, 1, 4));
  EXPECT_EQ(plan.placement, BaseWeightPlacement::kStreamed);
  EXPECT_THAT(plan.reason, HasSubstr("over the budget"));
}

// One row of 300,000 tokens at the 7B shape in an 80 GB card's 74 GiB: with every input on the
// device and whole MLPs nothing fits, not even streamed. The activation plan would tile the
// MLPs and, given host memory to pin, offload inputs: counted so, the weights stay on the device.
TEST(BaseWeightPlanTest, LongRowsCountTilesAndOffloadedInputsBeforeMovingWeights) {
  BaseWeightPlanRequest r = Request(LlamaConfig{}, 1, 1, 74);
  r.activations.sequence_length = 300000;
  r.mlp_tiles = false;
  const BaseWeightPlan whole = PlanBaseWeights(r);
  EXPECT_EQ(whole.placement, BaseWeightPlacement::kStreamed);
  EXPECT_THAT(whole.reason, HasSubstr("over the budget"));
  EXPECT_EQ(whole.mlp_tile_rows, 0);

  r.mlp_tiles = true;
  r.activation_host_bytes = 100 * kGiB;
  const BaseWeightPlan planned = PlanBaseWeights(r);
  EXPECT_EQ(planned.placement, BaseWeightPlacement::kOnDevice);
  EXPECT_EQ(planned.zero_stage, 2);
  EXPECT_EQ(planned.mlp_tile_rows, kMlpTileRows);
  EXPECT_GT(planned.offloaded_inputs, 0);
  EXPECT_LE(planned.planned_peak_bytes, static_cast<int64_t>(0.92 * 74 * kGiB));
  EXPECT_THAT(planned.reason, HasSubstr("stage 2, base weights on device"));
  EXPECT_THAT(planned.reason, HasSubstr("their MLPs in tiles of 8192 rows and"));
  EXPECT_THAT(planned.reason, HasSubstr("of their inputs in host memory"));

  // Without host memory to pin (offloading off), tiles alone do not fit.
  r.activation_host_bytes = 0;
  EXPECT_EQ(PlanBaseWeights(r).placement, BaseWeightPlacement::kStreamed);
  // A short row never tiles or offloads: the plan's figures as before.
  BaseWeightPlanRequest short_row = Request(LlamaConfig{}, 4, 1, 24);
  short_row.activation_host_bytes = 100 * kGiB;
  const BaseWeightPlan plain = PlanBaseWeights(short_row);
  EXPECT_EQ(plain.mlp_tile_rows, 0);
  EXPECT_EQ(plain.offloaded_inputs, 0);
  EXPECT_EQ(plain.planned_peak_bytes, PlanBaseWeights(Request(LlamaConfig{}, 4, 1, 24)).planned_peak_bytes);
}

// A plain layer's graph keeps its gathered weights until its backward; two layers are in flight.
TEST(BaseWeightPlanTest, GatheredLayersCountPerPlainLayer) {
  ActivationPlanRequest r = SeventyBSlice(1);
  const int64_t layers = r.model.num_hidden_layers;
  const int64_t without = PlannedPeakBytes(r, 2);
  r.gathered_layer_bytes = 400 << 20;
  EXPECT_EQ(PlannedPeakBytes(r, 2) - without, (layers - 2 + 2) * r.gathered_layer_bytes);
}

}  // namespace
}  // namespace qlora::memory
