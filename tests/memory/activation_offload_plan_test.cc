// offload_activation_layers: auto's model (worker/memory/activation_offload_plan.h): the forward's FLOPs,
// the layers whose copies fit in a forward at round 9's H200 rates (where the benchmark found its
// best count), the host memory bound, and the plan under a budget that recomputes the fewest
// layers.
#include "worker/memory/activation_offload_plan.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/memory/plan_shapes.h"

namespace qlora::memory {
namespace {

// One H200 as round 9 measured it: ~55 GB/s pinned copies, GEMMs ~700 TFLOP/s at the power
// limit, and a host with room to spare.
memory::OffloadRates H200() { return memory::OffloadRates{55e9, 700e12, int64_t{100} << 30}; }

int64_t Recomputed(const memory::OffloadedPlan& p) {
  return memory::RecomputedLayers(p.memory.layers, p.memory.checkpointed_layers, p.offloaded_layers);
}

TEST(ActivationOffloadPlan, ForwardFlopsOfTheSevenBLayer) {
  // q/k/v/o 4 x 4096^2, gate/up/down 3 x 4096 x 11008, two multiply-adds each; attention: q k^T
  // and p v over 1024.5 positions on average, 4096 wide, two FLOPs each.
  const double projections = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008;
  EXPECT_DOUBLE_EQ(memory::LayerForwardFlopsPerToken(SevenB(24)), 2 * projections + 2.0 * 4096 * 2049);
}

// Round 9d measured 14,767 / 14,966 / 15,224 / 14,850 / 14,634 tokens/s with 8 / 10 / 12 / 14 /
// 16 layers offloaded (31 checkpointed), round 10a 15,507 with 11 and 15,477 with 12: the forward
// (~210 ms at 700 TFLOP/s over 0.75) and the top layer's backward carry 12.0 GB at 55 GB/s, 11
// layers' saved tensors (901 MB each) and the other 20 inputs (67 MB).
TEST(ActivationOffloadPlan, SevenBMicroBatch4OffloadsWhatTheLinkKeepsUpWith) {
  const memory::ActivationPlanRequest r = SevenB(24);
  EXPECT_EQ(memory::OffloadableLayers(r, 31, H200()), 11);
  memory::OffloadRates slower = H200();
  slower.host_link_bytes_per_s = 25e9;  // PCIe 4
  EXPECT_EQ(memory::OffloadableLayers(r, 31, slower), 4);
  memory::OffloadRates faster_gemms = H200();
  faster_gemms.gemm_flops_per_s = 1400e12;  // a shorter forward carries less
  EXPECT_LT(memory::OffloadableLayers(r, 31, faster_gemms), 11);
  // Never the top layer, however fast the link.
  memory::OffloadRates fast_link = H200();
  fast_link.host_link_bytes_per_s = 1e15;
  EXPECT_EQ(memory::OffloadableLayers(r, 31, fast_link), 31);
  // Unknown rates: none.
  EXPECT_EQ(memory::OffloadableLayers(r, 31, memory::OffloadRates{}), 0);
}

// The 70B-width slice at micro-batch 1 (5 of 6 layers checkpointed): round 9c measured 21,658
// tokens/s with all 5 offloaded (16,516 with none), round 10b 20,029 with 4. A layer's 504 MB come
// back while the top layer's backward and the region's run.
TEST(ActivationOffloadPlan, SeventyBSliceMicroBatch1OffloadsEveryCheckpointedLayer) {
  EXPECT_EQ(memory::OffloadableLayers(SeventyBSlice(1), 5, memory::OffloadRates{53.5e9, 695e12, int64_t{100} << 30}), 5);
}

TEST(ActivationOffloadPlan, HostMemoryBoundsTheCount) {
  memory::OffloadRates rates = H200();
  // Each pinned block counted an eighth larger (pinned_block_bytes.h): 10 GiB hold 8 layers'
  // saved tensors (901 MB each) and the other 23 checkpointed inputs (67 MB each), 9.8 GB with
  // the eighth; a ninth layer would take 10.8 GB. (Torch's power-of-two blocks held 3.)
  rates.host_bytes = int64_t{10} << 30;
  EXPECT_EQ(memory::OffloadableLayers(SevenB(24), 31, rates), 8);
  rates.host_bytes = 0;
  EXPECT_EQ(memory::OffloadableLayers(SevenB(24), 31, rates), 0);
}

// true with auto: where a layer in transit raises the planned peak (the 70B slice at micro-batch
// 4: 504 MB a layer of saved tensors against one 16 MB input less) offloading needs the room.
TEST(ActivationOffloadPlan, TrueOffloadsWhereTheGpuHasRoomForTheLayerInTransit) {
  const memory::ActivationPlanRequest wide = SeventyBSlice(4);
  const memory::OffloadRates rates{53.5e9, 695e12, int64_t{100} << 30};
  memory::ActivationPlanRequest with = wide;
  with.offloaded_layers = 1;
  const int64_t alone = memory::PlannedPeakBytes(wide, 5), offloaded = memory::PlannedPeakBytes(with, 5);
  ASSERT_GT(offloaded, alone);
  const int64_t capacity = memory::OffloadableLayers(wide, 5, rates);
  ASSERT_GT(capacity, 0);
  EXPECT_EQ(memory::OffloadAmongCheckpointed(wide, 5, rates, 140 * kGiB), capacity);  // an H200's room
  EXPECT_EQ(memory::OffloadAmongCheckpointed(wide, 5, rates, static_cast<int64_t>(alone / 0.92) + 1), 0);
  // The 7B shape at micro-batch 4: offloading lowers the peak, so it needs no room of its own.
  const memory::ActivationPlanRequest narrow = SevenB(24);
  EXPECT_EQ(memory::OffloadAmongCheckpointed(narrow, 31, H200(), 1), 11);
}

// At 24 GiB the plan alone checkpoints 13 layers (memory_plan_test.cc).
TEST(ActivationOffloadPlan, AutoBudgetRecomputesFewerLayersWithinTheLink) {
  const memory::ActivationPlanRequest r = SevenB(24);
  const absl::StatusOr<memory::ActivationPlan> alone = memory::PlanCheckpointing(r);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_EQ(alone->checkpointed_layers, 13);
  const absl::StatusOr<memory::OffloadedPlan> p = memory::PlanCheckpointingWithOffload(r, H200());
  ASSERT_TRUE(p.ok()) << p.status();
  // 14 checkpointed (one layer's tensors in transit take memory), 7 of them offloaded: 7 layers
  // recomputed instead of 13. More would pile up: the 14 layers' forward (~92 ms) makes 6.8 GB of
  // copies, the link moves 5.1 GB meanwhile, and the offloader lets 2 GiB wait. (Round 10a
  // offloaded 12 of 13 by a model of the forward alone: 96 ms a step slower than none; round 10b
  // 8 of 14 without the backlog: 17 ms faster, of the ~50 ms of recomputation spared.)
  EXPECT_EQ(p->memory.checkpointed_layers, 14);
  EXPECT_EQ(p->offloaded_layers, 7);
  EXPECT_EQ(p->offloadable_layers, 7);
  EXPECT_LT(Recomputed(*p), 13);
  EXPECT_LE(p->memory.planned_peak_bytes, static_cast<int64_t>(0.92 * 24 * kGiB));
  // The plan's figures are the memory plan's for that split.
  memory::ActivationPlanRequest with = r;
  with.offloaded_layers = p->offloaded_layers;
  EXPECT_EQ(p->memory.planned_peak_bytes, memory::PlannedPeakBytes(with, p->memory.checkpointed_layers));
  // No fewer offloaded layers recompute as few.
  for (int64_t n = 0; n < p->offloaded_layers; ++n) {
    with.offloaded_layers = n;
    const absl::StatusOr<memory::ActivationPlan> fewer = memory::PlanCheckpointing(with);
    if (!fewer.ok()) continue;
    EXPECT_GT(memory::RecomputedLayers(fewer->layers, fewer->checkpointed_layers, n), Recomputed(*p))
        << n;
  }
}

TEST(ActivationOffloadPlan, AutoBudgetThatFitsWithoutCheckpointingOffloadsNothing) {
  const absl::StatusOr<memory::OffloadedPlan> p = memory::PlanCheckpointingWithOffload(SevenB(40), H200());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->memory.checkpointed_layers, 0);
  EXPECT_EQ(p->offloaded_layers, 0);
}

TEST(ActivationOffloadPlan, AutoBudgetWithoutALinkIsThePlanAlone) {
  const absl::StatusOr<memory::OffloadedPlan> p = memory::PlanCheckpointingWithOffload(SevenB(24), memory::OffloadRates{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->offloaded_layers, 0);
  EXPECT_EQ(p->memory.checkpointed_layers, 13);
  // Below what even every layer checkpointed needs, with or without offloading: the plan's error.
  const absl::StatusOr<memory::OffloadedPlan> small = memory::PlanCheckpointingWithOffload(SevenB(6), H200());
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(small.status().message()), ::testing::HasSubstr("trainer.max_memory_gib"));
}

TEST(ActivationOffloadPlan, DescribesWhatItMeasured) {
  EXPECT_EQ(memory::DescribeOffloadCapacity(SevenB(24), 31, H200()),
            "host link 55.0 GB/s, GEMMs 700 TFLOP/s, 100.0 GiB of host memory for 31 layers: the link "
            "keeps up with 11 layers' copies");
}

// A row so long that the host cannot hold every checkpointed input beside one offloaded layer's
// saves, nor the device hold them beside a layer's recomputation: the plan offloads the inputs
// alone, the fewest with which the step fits, within what the host holds.
TEST(ActivationOffloadPlan, LongestRowsOffloadTheInputsAloneWhereNothingElseFits) {
  const memory::ActivationPlanRequest r = SevenBRow(240000);
  memory::OffloadRates rates = H200();
  rates.host_bytes = 60 * kGiB;  // half of a 128 GiB host, less what is in use
  // Every input (31 of them, 1.83 GiB each) with one layer's saves is more than the host holds;
  // on the device they do not fit beside the top layer's recomputation, tiled or not.
  EXPECT_EQ(memory::OffloadableLayers(r, 32, rates), 0);
  ASSERT_FALSE(memory::PlanCheckpointing(r).ok());
  const absl::StatusOr<memory::OffloadedPlan> p = memory::PlanCheckpointingWithOffload(r, rates);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->offloaded_layers, 0);
  ASSERT_GT(p->offloaded_inputs, 0);
  const int64_t c = p->memory.checkpointed_layers;
  EXPECT_GE(c, 31);
  const int64_t usable = static_cast<int64_t>(static_cast<double>(r.budget_bytes) * (1 - r.margin_fraction));
  memory::ActivationPlanRequest with = r;
  with.offloaded_inputs = p->offloaded_inputs;
  with.mlp_tile_rows = p->memory.mlp_tile_rows;
  EXPECT_EQ(p->memory.planned_peak_bytes, memory::PlannedPeakBytes(with, c));
  EXPECT_LE(p->memory.planned_peak_bytes, usable);
  with.offloaded_inputs = p->offloaded_inputs - 1;  // the fewest: one less does not fit
  EXPECT_GT(memory::PlannedPeakBytes(with, c), usable);
  // Each input offloaded takes its bytes off the device's peak, and its pinned copy (an eighth
  // more at most) fits the host.
  const int64_t input_bytes = r.sequence_length * 4096 * 2;
  EXPECT_EQ(memory::PlannedPeakBytes(with, c) - p->memory.planned_peak_bytes, input_bytes);
  EXPECT_LE(9 * input_bytes / 8 * p->offloaded_inputs, rates.host_bytes);
  EXPECT_LE(p->offloaded_inputs, memory::OffloadableInputs(r, c, rates));
  // enable_gradient_checkpointing: true finds the same count for the same tiles.
  with.offloaded_inputs = -1;
  EXPECT_EQ(memory::InputsAmongCheckpointed(with, c, rates, r.budget_bytes), p->offloaded_inputs);
  // A host that holds too few inputs: the plan alone's error.
  rates.host_bytes = 4 * kGiB;
  EXPECT_EQ(memory::OffloadableInputs(r, c, rates), 1);
  const absl::StatusOr<memory::OffloadedPlan> small = memory::PlanCheckpointingWithOffload(r, rates);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(memory::InputsAmongCheckpointed(r, c, rates, r.budget_bytes), 1);  // its lowest peak
  // Rows that fit without offloading offload nothing.
  EXPECT_EQ(memory::InputsAmongCheckpointed(SevenBRow(16384), 32, rates, r.budget_bytes), 0);
}

// The row measured on an H100: 345,000 tokens of the LLaMA-3.1-8B shape under a 76 GiB budget
// with 100 GiB of host memory. The plan must fit it (tiles, every layer checkpointed, some inputs
// in host memory) and stay at or above the 60.8 GiB peak the allocator measured, as it did
// (67.4 GiB planned): a planner that refused this row, or planned under what it took, fails here.
TEST(ActivationOffloadPlan, TheMeasuredLongestRowPlansWithinItsBudgetAndAboveItsPeak) {
  const memory::ActivationPlanRequest r = EightBRow(345000);
  const memory::OffloadRates rates{55.3e9, 733e12, 100 * kGiB};  // the run's measured rates
  const absl::StatusOr<memory::OffloadedPlan> p = memory::PlanCheckpointingWithOffload(r, rates);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->memory.checkpointed_layers, 32);
  EXPECT_EQ(p->memory.mlp_tile_rows, memory::kMlpTileRows);
  EXPECT_EQ(p->offloaded_layers, 0);
  EXPECT_GT(p->offloaded_inputs, 0);
  EXPECT_LE(p->memory.planned_peak_bytes, memory::UsableBytes(r, r.budget_bytes));
  constexpr int64_t kMeasuredPeak = 65322116608;  // device_peak_bytes of the run's step
  EXPECT_GE(p->memory.planned_peak_bytes, kMeasuredPeak);
  // Its inputs' pinned copies fit the host budget.
  const int64_t input_bytes = r.sequence_length * 4096 * 2;
  EXPECT_LE(9 * input_bytes / 8 * p->offloaded_inputs, rates.host_bytes);
}

// enable_gradient_checkpointing: true at 240,000 tokens with a host that holds every input and
// some layers' saves: no count of offloaded layers fits beside its layers in transit, the inputs
// alone do, so true takes them; where layers fit, it keeps them.
TEST(ActivationOffloadPlan, TrueTakesTheInputsAloneWhereNoLayerCountFits) {
  memory::ActivationPlanRequest r = SevenBRow(240000);
  r.mlp_tile_rows = memory::kMlpTileRows;
  memory::OffloadRates rates = H200();
  rates.host_bytes = 200 * kGiB;
  const int64_t usable = memory::UsableBytes(r, r.budget_bytes);
  memory::ActivationPlanRequest layers = r;
  layers.offloaded_layers = memory::OffloadAmongCheckpointed(r, 32, rates, r.budget_bytes);
  ASSERT_GT(layers.offloaded_layers, 0);
  ASSERT_GT(memory::PlannedPeakBytes(layers, 32), usable);  // the lowest peak, still over
  const memory::CheckpointedOffload choice =
      memory::OffloadForCheckpointed(r, 32, rates, r.budget_bytes);
  EXPECT_EQ(choice.layers, 0);
  EXPECT_EQ(choice.inputs, memory::InputsAmongCheckpointed(r, 32, rates, r.budget_bytes));
  memory::ActivationPlanRequest inputs = r;
  inputs.offloaded_inputs = choice.inputs;
  EXPECT_LE(memory::PlannedPeakBytes(inputs, 32), usable);
  // 200,000 tokens: 8 layers fit, and stay the choice.
  const memory::CheckpointedOffload shorter =
      memory::OffloadForCheckpointed(SevenBRow(200000), 32, rates, r.budget_bytes);
  EXPECT_GT(shorter.layers, 0);
  EXPECT_EQ(shorter.inputs, -1);
}

// The layers an offload takes and the layer whose hook fetches each back.
std::vector<int64_t> Offloaded(const memory::OffloadPlacement& p) {
  std::vector<int64_t> layers;
  for (size_t i = 0; i < p.offloaded.size(); ++i) {
    if (p.offloaded[i]) layers.push_back(static_cast<int64_t>(i));
  }
  return layers;
}
int64_t FetchedAt(const memory::OffloadPlacement& p, int64_t group) {
  for (size_t at = 0; at < p.prefetch_at.size(); ++at) {
    for (int64_t g : p.prefetch_at[at]) {
      if (g == group) return static_cast<int64_t>(at);
    }
  }
  return -1;
}

TEST(ActivationOffloadPlan, CheckpointedLayersOffloadEvenlyAndComeBackTwoLayersAhead) {
  const memory::OffloadPlacement p = memory::PlaceOffloads(32, 32, 4);
  EXPECT_EQ(Offloaded(p), (std::vector<int64_t>{3, 11, 19, 27}));
  EXPECT_EQ(FetchedAt(p, 27), 29);
  EXPECT_EQ(FetchedAt(p, 3), 5);
  // Every other checkpointed layer's input one layer ahead (the top layer's never leaves).
  EXPECT_EQ(FetchedAt(p, 4), 5);
  EXPECT_EQ(FetchedAt(p, 30), 31);
  EXPECT_EQ(FetchedAt(p, 31), -1);
  EXPECT_EQ(p.prefetch_at[5], (std::vector<int64_t>{4, 3}));  // the highest first
}

// Inputs alone: the highest checkpointed layers' below the top one, each fetched one layer ahead;
// no layer's saved tensors travel.
TEST(ActivationOffloadPlan, InputsAloneTravelFromTheHighestCheckpointedLayers) {
  const memory::OffloadPlacement p = memory::PlaceOffloads(8, 8, 0, 3);
  EXPECT_TRUE(Offloaded(p).empty());
  EXPECT_EQ(p.input_offloaded, (std::vector<bool>{false, false, false, false, true, true, true, false}));
  EXPECT_EQ(FetchedAt(p, 6), 7);
  EXPECT_EQ(FetchedAt(p, 4), 5);
  EXPECT_EQ(FetchedAt(p, 3), -1);  // stays on the device
  // More than there are: every one below the top layer; with layers offloaded, -1 is all.
  EXPECT_EQ(memory::PlaceOffloads(8, 5, 0, 40).input_offloaded,
            (std::vector<bool>{true, true, true, true, true, false, false, false}));
  const memory::OffloadPlacement both = memory::PlaceOffloads(8, 8, 2);
  for (int64_t j = 0; j < 7; ++j) EXPECT_EQ(both.input_offloaded[j], !both.offloaded[j]) << j;
  EXPECT_FALSE(both.input_offloaded[7]);
  EXPECT_EQ(memory::PlaceOffloads(8, 8, 0).input_offloaded, std::vector<bool>(8, false));
}

// Without checkpointing (round 22): a plain layer's backward (~7 ms at 7B micro-batch 4) is a
// third of its tensors' copy back (~0.9 GB at ~55 GB/s), so offloaded plain layers are spread,
// never consecutive at the bottom (where each would wait for its copy), and each comes back as
// soon as the one above it is on its way.
TEST(ActivationOffloadPlan, PlainLayersOffloadEvenlyAndComeBackAfterTheOneAbove) {
  const memory::OffloadPlacement p = memory::PlaceOffloads(32, 0, 10);
  EXPECT_EQ(Offloaded(p), (std::vector<int64_t>{0, 3, 6, 9, 12, 15, 18, 21, 24, 27}));
  EXPECT_EQ(FetchedAt(p, 27), 31);  // the top layer's hook: four layers of backward ahead
  EXPECT_EQ(FetchedAt(p, 24), 27);
  EXPECT_EQ(FetchedAt(p, 0), 3);
  EXPECT_EQ(FetchedAt(p, 1), -1);  // plain and not offloaded: nothing travels
  // All plain layers but the top one: each fetched by the one above it.
  const memory::OffloadPlacement all = memory::PlaceOffloads(4, 0, 10);
  EXPECT_EQ(Offloaded(all), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(FetchedAt(all, 0), 1);
  EXPECT_EQ(FetchedAt(all, 2), 3);
}

// Among checkpointed layers the placement is the one rounds 9-20 measured, for every split:
// evenly at (2k + 1) c' / 2n (c' = the checkpointed layers but the top one), each fetched two
// layers ahead or at the next offloaded layer if nearer, every other input one layer ahead; and
// as many layers go as asked, never the top one.
TEST(ActivationOffloadPlan, CheckpointedPlacementIsUnchangedForEverySplit) {
  for (int64_t layers = 1; layers <= 40; ++layers) {
    for (int64_t c = 0; c <= layers; ++c) {
      for (int64_t n = 0; n <= layers + 1; ++n) {
        SCOPED_TRACE(::testing::Message() << layers << " layers, " << c << " checkpointed, " << n);
        const memory::OffloadPlacement p = memory::PlaceOffloads(layers, c, n);
        ASSERT_EQ(static_cast<int64_t>(p.offloaded.size()), layers);
        EXPECT_EQ(static_cast<int64_t>(Offloaded(p).size()), std::min(n, std::max<int64_t>(layers - 1, 0)));
        if (layers > 0) EXPECT_FALSE(p.offloaded[layers - 1]);
        const int64_t candidates = std::min(c, layers - 1);
        const int64_t from_checkpointed = std::min(n, candidates);
        std::vector<bool> expected(layers, false);
        for (int64_t k = 0; k < from_checkpointed; ++k) {
          expected[(2 * k + 1) * candidates / (2 * from_checkpointed)] = true;
        }
        for (int64_t j = 0; j < candidates; ++j) {
          EXPECT_EQ(p.offloaded[j], expected[j]) << "layer " << j;
          if (n == 0) continue;  // offloading off: nothing travels
          int64_t at = j + 1;    // (the nearer offloaded layer may be the lowest plain one)
          if (expected[j]) at = p.offloaded[j + 1] ? j + 1 : std::min(j + 2, layers - 1);
          EXPECT_EQ(FetchedAt(p, j), at) << "layer " << j;
        }
        if (n == 0) {
          for (const std::vector<int64_t>& groups : p.prefetch_at) EXPECT_TRUE(groups.empty());
        }
      }
    }
  }
}

TEST(ActivationOffloadPlan, OffloadsBeyondTheCheckpointedLayersSpreadOverThePlainOnes) {
  const memory::OffloadPlacement p = memory::PlaceOffloads(32, 8, 12);
  EXPECT_EQ(Offloaded(p), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 13, 19, 25}));
  EXPECT_EQ(FetchedAt(p, 7), 8);    // checkpointed, the next offloaded layer is nearer than two
  EXPECT_EQ(FetchedAt(p, 8), 13);   // plain: the next offloaded layer above
  EXPECT_EQ(FetchedAt(p, 25), 31);
  EXPECT_TRUE(Offloaded(memory::PlaceOffloads(32, 0, 0)).empty());
  EXPECT_TRUE(Offloaded(memory::PlaceOffloads(1, 0, 3)).empty());  // the top layer never goes
}

}  // namespace
}  // namespace qlora::memory
