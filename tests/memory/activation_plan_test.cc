// The checkpointing memory plan (worker/memory/activation_plan.h): monotone in the budget, every
// layer checkpointed at a low budget, none at a huge one, a clear error below the minimum, and
// the figures of the benchmark's shape.
#include "worker/memory/activation_plan.h"


#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/memory/plan_shapes.h"

namespace qlora::memory {
namespace {

using ::testing::HasSubstr;

// The 7B figures (per token, bytes): a plain layer saves 110,056 (x, q, k, v, attention output,
// logsumexp, h, gate and up with 64 spare columns, the shared LoRA inputs n and m, 7 x r d;
// down's input, the SwiGLU output, is recomputed in its backward), a checkpointed one 8,192 (its
// recomputation saves a plain layer's and the SwiGLU output, 22,016 more); one layer's backward
// 65,536, 8,320 more where no layer is checkpointed (q/k/v's gradients packed) (the attention's:
// the MLP's is 60,416 since SwiGLU's gate gradient overwrites the down projection's input
// gradient; 82,432 before); the adapters' bf16 copies add 80 MB and the q/k/v and gate/up As
// concatenated 21 MB (adapter_copies.h). At 8,192 tokens per micro-batch:
//   every layer checkpointed  planned peak  8.15 GiB  (the H200 bench measured 7.82 GiB when the
//                                                      plan said 8.19)
//   all but the top one                     8.09 GiB  (the leanest: its recomputation is skipped;
//                                                      7.68 GiB measured when the plan said 8.13)
//   none checkpointed                      32.14 GiB  (measured 31.67 GiB with the plan at 32.08,
//                                                      31.60 with it at 32.03, 31.62 at 32.05)
//   (micro-batch 1: 5.4 GiB all checkpointed, measured 5.21 GiB)
//   budget  9 GiB  ->  31 of 32 checkpointed, planned peak  8.1 GiB
//   budget 24 GiB  ->  13 of 32 checkpointed, planned peak 22.0 GiB (22.08 usable after 8%)
//   budget 32 GiB  ->   4 of 32 checkpointed
//   budget 40 GiB  ->   0 of 32 checkpointed, planned peak 32.14 GiB
//   budget  6 GiB  ->   FAILED_PRECONDITION (8.8 GiB needed with the margin)
// (On CUDA, fused_norms: a plain layer saves 93,672, neither n nor m; FusedNormsKeepNeither...)
TEST(ActivationPlan, SevenBAtMicroBatch4Sequence2048) {
  const memory::ActivationPlanRequest r = SevenB(24);
  const memory::LayerActivationBytes per = memory::PerTokenLayerBytes(r);
  EXPECT_EQ(per.plain, 110056);
  EXPECT_EQ(per.recomputed, 110056 + 11008 * 2 - 8192);
  EXPECT_EQ(per.checkpointed, 8192);
  EXPECT_EQ(per.backward, 65536);
  EXPECT_EQ(per.packed_gradients, 8320);
  EXPECT_NEAR(static_cast<double>(memory::PlannedPeakBytes(r, 32)) / kGiB, 8.15, 0.01);
  EXPECT_NEAR(static_cast<double>(memory::PlannedPeakBytes(r, 31)) / kGiB, 8.09, 0.01);
  EXPECT_NEAR(static_cast<double>(memory::PlannedPeakBytes(r, 0)) / kGiB, 32.14, 0.01);
  absl::StatusOr<memory::ActivationPlan> plan = memory::PlanCheckpointing(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layers, 32);
  EXPECT_EQ(plan->checkpointed_layers, 13);
  EXPECT_LE(plan->planned_peak_bytes, static_cast<int64_t>(0.92 * 24 * kGiB));
  EXPECT_GT(memory::PlannedPeakBytes(r, plan->checkpointed_layers - 1),
            static_cast<int64_t>(0.92 * 24 * kGiB));  // one fewer would not fit
  EXPECT_EQ(memory::DescribePlan(*plan),
            "activation checkpointing: 13 of 32 layers checkpointed, planned peak 22.0 GiB of a "
            "24.0 GiB budget");
  EXPECT_EQ(memory::PlanCheckpointing(SevenB(32))->checkpointed_layers, 4);
  EXPECT_EQ(memory::PlanCheckpointing(SevenB(40))->checkpointed_layers, 0);
}

TEST(ActivationPlan, PeakGrowsWithEveryPlainLayerBelowTheTop) {
  const memory::ActivationPlanRequest r = SevenB(24);
  // The top layer kept costs less than recomputing it (which saves the SwiGLU output too).
  EXPECT_LT(memory::PlannedPeakBytes(r, 31), memory::PlannedPeakBytes(r, 32));
  EXPECT_EQ(memory::LeanestCheckpointedLayers(r), 31);  // what enable_gradient_checkpointing: true runs
  for (int64_t c = 31; c > 0; --c) EXPECT_LE(memory::PlannedPeakBytes(r, c), memory::PlannedPeakBytes(r, c - 1)) << c;
}

// Offloaded layers (activation_offload.h) hold neither their inputs nor their activations on the
// device but one layer's activations are in transit, and the other checkpointed layers' inputs
// wait in host memory too (two on the device): with every layer checkpointed, offloading 8 of
// them trades 30 inputs for one plain layer's activations at the peak (the top layer's
// recomputation); among plain layers each one offloaded frees a plain layer's activations, up to
// all but the top one, where neighbours put two in transit.
TEST(ActivationPlan, OffloadedLayersTradeTheirActivationsForOneInTransit) {
  memory::ActivationPlanRequest r = SevenB(24);
  const memory::LayerActivationBytes per = memory::PerTokenLayerBytes(r);
  const int64_t tokens = 4 * 2048;
  const int64_t all_checkpointed = memory::PlannedPeakBytes(r, 32), none = memory::PlannedPeakBytes(r, 0);
  r.offloaded_layers = 8;
  EXPECT_EQ(memory::PlannedPeakBytes(r, 32) - all_checkpointed,
            tokens * (per.plain - 30 * per.checkpointed));
  // 8 of 32 plain layers offloaded: 7 fewer held (one is in transit).
  EXPECT_EQ(none - memory::PlannedPeakBytes(r, 0), 7 * tokens * per.plain);
  r.offloaded_layers = 40;  // more than there are: all but the top layer, neighbours
  EXPECT_EQ(none - memory::PlannedPeakBytes(r, 0), 29 * tokens * per.plain);
}

// Offloaded layers spread evenly: neighbours only past every other layer. With 31 layers
// checkpointed (the top one never offloaded), 16 offloaded take every other one of the 31; 17
// cannot.
TEST(ActivationPlan, OffloadedLayersAreNeighboursOnlyPastEveryOtherLayer) {
  const std::vector<bool> sixteen = memory::OffloadedLayerSet(32, 31, 16);
  EXPECT_EQ(std::count(sixteen.begin(), sixteen.end(), true), 16);
  EXPECT_FALSE(sixteen[31]);
  EXPECT_FALSE(memory::OffloadedNeighbours(32, 31, 16));
  EXPECT_TRUE(memory::OffloadedNeighbours(32, 31, 17));
  EXPECT_FALSE(memory::OffloadedNeighbours(32, 31, 1));
  EXPECT_FALSE(memory::OffloadedNeighbours(32, 0, 0));
  // Plain layers: 3 of the 7 below the top one keep gaps, 4 do not.
  EXPECT_FALSE(memory::OffloadedNeighbours(8, 0, 3));
  EXPECT_TRUE(memory::OffloadedNeighbours(8, 0, 4));
}

// Rows of 16,384 tokens at micro-batch 1, 31 checkpointed: the forward holds two offloaded
// layers' saves at once past 16 offloaded (the benchmark's allocator trace found both in
// forward's peak with 18), one at 16 or fewer.
TEST(ActivationPlan, OffloadedNeighboursHoldTwoLayersInForward) {
  memory::ActivationPlanRequest r = SevenBRow(16384);
  const memory::LayerActivationBytes per = memory::PerTokenLayerBytes(r);
  r.offloaded_layers = 16;
  const int64_t sixteen = memory::PlannedPeakBytes(r, 31);
  r.offloaded_layers = 17;
  const int64_t seventeen = memory::PlannedPeakBytes(r, 31);
  // One input more offloaded, one layer's saves more in transit.
  EXPECT_GE(seventeen - sixteen, 16384 * (per.plain - per.checkpointed) * 9 / 10);
}

TEST(ActivationPlan, MonotoneInTheBudget) {
  int64_t previous = 33;
  for (int64_t gib = 9; gib <= 64; ++gib) {
    absl::StatusOr<memory::ActivationPlan> plan = memory::PlanCheckpointing(SevenB(gib));
    ASSERT_TRUE(plan.ok()) << gib << ": " << plan.status();
    EXPECT_LE(plan->checkpointed_layers, previous) << gib;
    EXPECT_LE(plan->planned_peak_bytes, static_cast<int64_t>(0.92 * static_cast<double>(gib * kGiB)));
    previous = plan->checkpointed_layers;
  }
  // Just what the leanest split needs: all but the top layer checkpointed.
  memory::ActivationPlanRequest low = SevenB(0);
  low.budget_bytes = static_cast<int64_t>(static_cast<double>(memory::PlannedPeakBytes(low, 31)) / 0.92) + 1;
  EXPECT_EQ(memory::PlanCheckpointing(low)->checkpointed_layers, 31);
  EXPECT_LT(memory::PlannedPeakBytes(low, 31), memory::PlannedPeakBytes(low, 30));
  EXPECT_EQ(memory::PlanCheckpointing(SevenB(1000))->checkpointed_layers, 0);  // huge: none
}

TEST(ActivationPlan, BelowTheMinimumNamesBothNumbers) {
  absl::StatusOr<memory::ActivationPlan> plan = memory::PlanCheckpointing(SevenB(6));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("trainer.max_memory_gib: a budget of 6.0 GiB is below"));
  EXPECT_THAT(message, HasSubstr("a planned peak of 8.1 GiB, 8.8 GiB with the 8% margin"));
  EXPECT_THAT(message, HasSubstr("raise max_memory_gib to at least 8.8"));
  EXPECT_EQ(memory::PlanCheckpointing(SevenB(0)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ActivationPlan, CorrectionAndDropoutRaiseThePeak) {
  memory::ActivationPlanRequest r = SevenB(24);
  const int64_t base = memory::PlannedPeakBytes(r, 16);
  r.correction_bytes = kGiB;
  EXPECT_EQ(memory::PlannedPeakBytes(r, 16), base + kGiB);
  EXPECT_GT(memory::PlanCheckpointing(r)->checkpointed_layers, 13);
  r.correction_bytes = 0;
  r.lora_dropout = true;  // each adapted module keeps its own dropped input and mask
  EXPECT_GT(memory::PerTokenLayerBytes(r).plain, memory::PerTokenLayerBytes(SevenB(24)).plain);
  r.lora_r = 0;           // no adapters: the 4-bit GEMMs save no inputs
  EXPECT_EQ(memory::PerTokenLayerBytes(r).plain, 109928 - 4096 * 2 * 2 - 7 * 16 * 2);
}

// On CUDA the norms are fused and the q/k/v and gate/up nodes keep their sources (kept by the
// norms anyway) instead of n and m: 2 x 4,096 x 2 bytes a token less a plain layer, 4 GiB less
// at 7B with no layer checkpointed; the same with dropout (the nodes do not run) or with one
// layer of a group adapted (no node).
TEST(ActivationPlan, FusedNormsKeepNeitherNormsOutput) {
  memory::ActivationPlanRequest r = SevenB(40);
  r.fused_norms = true;
  EXPECT_EQ(memory::PerTokenLayerBytes(r).plain, 110056 - 2 * 4096 * 2);
  EXPECT_EQ(memory::PerTokenLayerBytes(r).recomputed, 110056 - 2 * 4096 * 2 + 11008 * 2 - 8192);
  EXPECT_EQ(memory::PlannedPeakBytes(SevenB(40), 0) - memory::PlannedPeakBytes(r, 0),
            int64_t{32} * 4 * 2048 * 2 * 4096 * 2);
  EXPECT_EQ(memory::PlanCheckpointing(r)->checkpointed_layers, 0);
  memory::ActivationPlanRequest dropout = SevenB(40), fused_dropout = SevenB(40);
  dropout.lora_dropout = fused_dropout.lora_dropout = true;
  fused_dropout.fused_norms = true;
  EXPECT_EQ(memory::PerTokenLayerBytes(fused_dropout).plain, memory::PerTokenLayerBytes(dropout).plain);
  memory::ActivationPlanRequest q_only = SevenB(40);
  q_only.lora_targets = {"q_proj"};
  memory::ActivationPlanRequest fused_q_only = q_only;
  fused_q_only.fused_norms = true;
  EXPECT_EQ(memory::PerTokenLayerBytes(fused_q_only).plain, memory::PerTokenLayerBytes(q_only).plain);
}

// Rows so long that one layer's MLP recomputation and backward outgrow the budget with every
// layer checkpointed: the plan tiles the checkpointed layers' MLPs, so that those hold one
// tile's MLP tensors; rows that fit whole stay whole.
TEST(ActivationPlan, LongRowsTileTheMlpsWhereWholeOnesDoNotFit) {
  memory::ActivationPlanRequest r = SevenBRow(100000);
  const memory::LayerActivationBytes per = memory::PerTokenLayerBytes(r);
  // Less gate, up and SwiGLU's output; h and the tiles' joined output more.
  EXPECT_LE(per.recomputed_tiled, per.recomputed - 3 * 11008 * 2 + 2 * 4096 * 2);
  EXPECT_LE(per.backward_tiled, per.backward);  // the attention's, at the 7B shape, either way
  const int64_t c = memory::LeanestCheckpointedLayers(r);
  memory::ActivationPlanRequest tiled = r;
  tiled.mlp_tile_rows = memory::kMlpTileRows;
  const int64_t whole_peak = memory::PlannedPeakBytes(r, c);
  const int64_t tiled_peak = memory::PlannedPeakBytes(tiled, c);
  ASSERT_LT(tiled_peak, whole_peak);
  // The tile's own tensors, one tile at a time.
  EXPECT_GE(tiled_peak, memory::kMlpTileRows * per.tile_row);
  r.budget_bytes = static_cast<int64_t>(static_cast<double>(whole_peak + tiled_peak) / 2 /
                                        (1 - r.margin_fraction));
  const absl::StatusOr<memory::ActivationPlan> plan = memory::PlanCheckpointing(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->mlp_tile_rows, memory::kMlpTileRows);
  EXPECT_LE(plan->planned_peak_bytes, r.budget_bytes);
  EXPECT_THAT(memory::DescribePlan(*plan), ::testing::HasSubstr("checkpointed (their MLPs in tiles of 8192 rows)"));
  EXPECT_EQ(memory::MlpTileRowsFor(r, c, r.budget_bytes), memory::kMlpTileRows);
  EXPECT_EQ(memory::MlpTileRowsFor(r, c, 2 * whole_peak), 0);
  r.budget_bytes = 2 * whole_peak;
  EXPECT_EQ(memory::PlanCheckpointing(r)->mlp_tile_rows, 0);
  // No tiles for a micro-batch of one tile or fewer rows.
  memory::ActivationPlanRequest short_rows = SevenBRow(memory::kMlpTileRows);
  EXPECT_EQ(memory::MlpTileRowsFor(short_rows, 32, 1), 0);
}

TEST(ActivationPlan, FormatMemory) {
  EXPECT_EQ(memory::FormatMemory(24 * kGiB), "24.0 GiB");
  EXPECT_EQ(memory::FormatMemory(512 << 20), "512.0 MiB");
}

}  // namespace
}  // namespace qlora::memory
