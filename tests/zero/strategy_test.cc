// ZeRO strategies over Gloo with ranks as threads: every stage at every world size reproduces one
// process with the same global batch; stages 1 and 2 hold 1/world of the optimizer state and
// stage 2 1/world of the gradients; checkpoints resume exactly, also on another world size.
//
// Tolerance: the strategies sum the same fp32 gradients in another order than the reference
// (per rank and micro-batch, then across ranks), a relative difference of a few fp32 ulps
// (~1e-7) per gradient element. AdamW's update lr * m / (sqrt(v) + eps) is scale-invariant in
// the gradient, so that difference reaches the weights as ~1e-7 x lr per step: after 6 steps at
// lr <= 0.05 well under 1e-7 of a weight of size ~1. We assert 1e-6 relative (to max(1, |w|)),
// and assert exact equality where the arithmetic is the same (resume vs. uninterrupted run).
// ScalarRead (the loss and norm reads that do not drain the queue) is tested here too.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/files.h"
#include "tests/util/temp_dir.h"
#include "tests/zero/gloo_world.h"
#include "tests/zero/synthetic_problem.h"
#include "worker/strategy/scalar_read.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace qlora {
namespace {

using ::testing::HasSubstr;
using testing::SyntheticProblem;

constexpr double kTolerance = 1e-6;
constexpr int kSteps = 6;

struct RunResult {
  std::vector<std::vector<at::Tensor>> params;  // per rank
  std::vector<strategy::MemoryReport> memory;   // per rank
  std::vector<strategy::ResumeReport> resumed;  // per rank, when loading
};

struct RunSpec {
  int stage = 0;
  int world = 1;
  int from = 0;
  int to = kSteps;
  std::string load;
  std::string save;
  int64_t bucket_elements = 40;  // several stage-2 buckets, one parameter larger than a bucket
  bool one_by_one = false;       // gradients through OnGradientReady, one call per parameter
};

RunResult RunWorld(const SyntheticProblem& p, const RunSpec& spec) {
  RunResult result;
  result.params.resize(spec.world);
  result.memory.resize(spec.world);
  result.resumed.resize(spec.world);
  auto statuses = testing::RunGlooWorld(spec.world, [&](int rank, comm::Communicator& c) {
    strategy::StrategyOptions options;
    options.adamw = p.adamw;
    options.max_grad_norm = p.max_grad_norm;
    options.bucket_elements = spec.bucket_elements;
    options.collective_timeout = absl::Seconds(30);
    // Ranks other than 0 start from other values: the factory must broadcast rank 0's.
    auto s = strategy::MakeStrategy(spec.stage, options, c,
                                    p.MakeParams(spec.load.empty() ? rank : 7.0 + rank));
    if (!s.ok()) return s.status();
    if (!spec.load.empty()) {
      auto resumed = (*s)->LoadCheckpoint(spec.load);
      if (!resumed.ok()) return resumed.status();
      result.resumed[rank] = *resumed;
    }
    absl::Status st =
        testing::TrainSteps(p, **s, spec.world, rank, spec.from, spec.to, spec.one_by_one);
    if (st.ok() && !spec.save.empty()) st = (*s)->SaveCheckpoint(spec.save);
    for (const auto& param : (*s)->params()) result.params[rank].push_back(param.tensor.detach().clone());
    result.memory[rank] = (*s)->Memory();
    return st;
  });
  for (int r = 0; r < spec.world; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  return result;
}

TEST(ZeroStrategy, EveryStageAndWorldSizeMatchesOneProcess) {
  SyntheticProblem p;
  std::vector<double> clips;
  const std::vector<at::Tensor> reference = testing::ReferenceTrain(p, kSteps, &clips);
  // The run must exercise clipping and also steps without it.
  EXPECT_THAT(clips, ::testing::Contains(::testing::Lt(1.0)));
  EXPECT_THAT(clips, ::testing::Contains(1.0));
  // And the weights must have moved, or equality would prove nothing.
  EXPECT_GT(testing::MaxRelativeError(reference, testing::ReferenceTrain(p, 0)), 1e-2);
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 2, 4}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", world " + std::to_string(world));
      RunResult run = RunWorld(p, {stage, world});
      std::printf("stage %d world %d: max relative deviation from one process %.3g\n", stage,
                  world, testing::MaxRelativeError(run.params[0], reference));
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(run.params[r].size(), reference.size());
        EXPECT_LE(testing::MaxRelativeError(run.params[r], reference), kTolerance) << "rank " << r;
        EXPECT_EQ(testing::MaxRelativeError(run.params[r], run.params[0]), 0.0) << "rank " << r;
      }
    }
  }
}

TEST(ZeroStrategy, Stage1And2HoldTheirShareOfStateAndStage2OfGradients) {
  SyntheticProblem p;
  constexpr int kWorld = 4;
  // 186 elements, padded to a multiple of 2 x 4 = 192, partitions of 48.
  constexpr int64_t kPadded = 192, kPart = 48, kF = 4;
  std::vector<strategy::MemoryReport> m;
  for (int stage : {0, 1, 2}) {
    RunResult run = RunWorld(p, {stage, kWorld, 0, 2});
    // The state every rank keeps is the same size; transient buffers follow bucket ownership.
    for (int r = 1; r < kWorld; ++r) {
      EXPECT_EQ(run.memory[r].total() - run.memory[r].comm_buffer_bytes,
                run.memory[0].total() - run.memory[0].comm_buffer_bytes);
    }
    m.push_back(run.memory[0]);
  }
  EXPECT_EQ(m[0].master_bytes, kPadded * kF);
  EXPECT_EQ(m[0].optimizer_bytes, 2 * kPadded * kF);
  EXPECT_EQ(m[0].gradient_bytes, kPadded * kF);
  for (int stage : {1, 2}) {
    EXPECT_EQ(m[stage].master_bytes, kPart * kF) << stage;
    EXPECT_EQ(m[stage].optimizer_bytes * kWorld, m[0].optimizer_bytes) << stage;
  }
  EXPECT_EQ(m[1].gradient_bytes, kPadded * kF);  // stage 1 keeps full gradients until the boundary
  EXPECT_EQ(m[2].gradient_bytes * kWorld, m[0].gradient_bytes);
  // Publishing the updated weights gathers into the parameters themselves (they are views of
  // the flat buffer): no transient copy of all the weights.
  EXPECT_LT(m[1].comm_buffer_bytes, kPadded * kF) << "stage 1 allocated a full-size buffer";
  // Stage 2's transient buffers stay near one bucket, not the whole gradient.
  EXPECT_LT(m[2].comm_buffer_bytes, kPadded * kF * 2);
  EXPECT_GT(m[2].comm_buffer_bytes, 0);
}

TEST(ZeroStrategy, ResumeOnTheSameWorldSizeEqualsAnUninterruptedRun) {
  SyntheticProblem p;
  testing::TempDir tmp;
  for (int stage : {0, 1, 2}) {
    const std::string dir = tmp.Sub("stage" + std::to_string(stage));
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunResult whole = RunWorld(p, {stage, 2});
    RunWorld(p, {stage, 2, 0, 3, "", dir});
    ASSERT_TRUE(testing::FileExists(dir + "/manifest.json"));
    RunResult resumed = RunWorld(p, {stage, 2, 3, kSteps, dir});
    EXPECT_FALSE(resumed.resumed[0].repartitioned);
    EXPECT_EQ(resumed.resumed[0].step, 3);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(testing::MaxRelativeError(resumed.params[r], whole.params[r]), 0.0) << "rank " << r;
    }
  }
}

TEST(ZeroStrategy, ResumeOnAnotherWorldSizeRepartitions) {
  SyntheticProblem p;
  const std::vector<at::Tensor> reference = testing::ReferenceTrain(p, kSteps);
  struct Case { int stage_before, world_before, stage_after, world_after; };
  testing::TempDir tmp;
  int index = 0;
  for (Case c : {Case{2, 4, 2, 2}, Case{1, 2, 1, 4}, Case{0, 2, 2, 4}, Case{2, 4, 0, 1},
                 Case{2, 4, 3, 2}, Case{3, 2, 2, 4}}) {
    SCOPED_TRACE(::testing::Message() << "stage " << c.stage_before << " x" << c.world_before
                                      << " -> stage " << c.stage_after << " x" << c.world_after);
    const std::string dir = tmp.Sub("case" + std::to_string(index++));
    RunWorld(p, {c.stage_before, c.world_before, 0, 3, "", dir});
    RunResult resumed = RunWorld(p, {c.stage_after, c.world_after, 3, kSteps, dir});
    const strategy::ResumeReport& report = resumed.resumed[0];
    EXPECT_TRUE(report.repartitioned);
    EXPECT_EQ(report.saved_world_size, c.world_before);
    EXPECT_EQ(report.saved_stage, c.stage_before);
    EXPECT_THAT(report.description, HasSubstr("re-partitioned"));
    for (int r = 0; r < c.world_after; ++r) {
      EXPECT_LE(testing::MaxRelativeError(resumed.params[r], reference), kTolerance) << "rank " << r;
    }
  }
}

TEST(ZeroStrategy, RefusesACheckpointOfOtherParameters) {
  SyntheticProblem p;
  testing::TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  RunWorld(p, {1, 2, 0, 1, "", dir});
  auto statuses = testing::RunGlooWorld(2, [&](int, comm::Communicator& c) {
    SyntheticProblem other;
    other.shapes[2] = {11, 12};
    auto s = strategy::MakeStrategy(1, {}, c, other.MakeParams());
    if (!s.ok()) return s.status();
    return (*s)->LoadCheckpoint(dir).status();
  });
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("lora_2.weight"));
  }
}

// The loss scale is 1 / the target tokens of all ranks (one rank: its own count, taken without
// a collective); a step in which no rank has any is refused.
TEST(ZeroStrategy, LossScaleCountsEveryRanksTargetTokens) {
  for (const int world : {1, 2}) {
    auto statuses = testing::RunGlooWorld(world, [&](int rank, comm::Communicator& c) {
      SyntheticProblem p;
      auto s = strategy::MakeStrategy(2, {}, c, p.MakeParams());
      if (!s.ok()) return s.status();
      auto scale = (*s)->ComputeLossScale(10 + rank);
      if (!scale.ok()) return scale.status();
      const int64_t expected = world == 1 ? 10 : 21;
      EXPECT_EQ(scale->global_target_tokens, expected) << "world " << world;
      EXPECT_EQ(scale->scale, 1.0 / static_cast<double>(expected)) << "world " << world;
      auto none = (*s)->ComputeLossScale(0);
      EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << "world " << world;
      EXPECT_EQ((*s)->ComputeLossScale(-1).status().code(), absl::StatusCode::kInvalidArgument);
      return absl::OkStatus();
    });
    for (const absl::Status& status : statuses) EXPECT_TRUE(status.ok()) << status;
  }
}

// TakeGradsFromParams hands all of a micro-batch's gradients over at once (one multi-tensor
// add where nothing is reduced in buckets: stages 0-1, and stage 2 on one rank); the weights
// are bit for bit those of reporting them one OnGradientReady call at a time.
TEST(ZeroStrategy, GradientsTakenTogetherEqualThemOneByOne) {
  SyntheticProblem p;
  for (const int world : {1, 2}) {
    for (const int stage : {0, 1, 2}) {
      RunSpec together;
      together.stage = stage;
      together.world = world;
      RunSpec one_by_one = together;
      one_by_one.one_by_one = true;
      const RunResult a = RunWorld(p, together), b = RunWorld(p, one_by_one);
      for (size_t k = 0; k < a.params[0].size(); ++k) {
        EXPECT_TRUE(at::equal(a.params[0][k], b.params[0][k]))
            << "world " << world << " stage " << stage << " parameter " << k;
      }
    }
  }
}

// Stage 3 treats the trainable parameters as stage 2 does, bit for bit, and says it partitions
// the base weights (which the model keeps: base_weights_test.cc).
TEST(ZeroStrategy, StageThreeTrainsTheAdaptersAsStageTwoBitForBit) {
  SyntheticProblem p;
  for (int world : {2, 4}) {
    RunResult two = RunWorld(p, {2, world}), three = RunWorld(p, {3, world});
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(two.params[r].size(), three.params[r].size());
      for (size_t k = 0; k < two.params[r].size(); ++k) {
        EXPECT_TRUE(at::equal(two.params[r][k], three.params[r][k]))
            << "world " << world << " rank " << r << " parameter " << k;
      }
      EXPECT_EQ(two.memory[r].total(), three.memory[r].total());
    }
  }
}

TEST(ZeroStrategy, FactoryKnowsStagesZeroToThree) {
  auto statuses = testing::RunGlooWorld(1, [&](int, comm::Communicator& c) {
    SyntheticProblem p;
    auto three = strategy::MakeStrategy(3, {}, c, p.MakeParams());
    EXPECT_TRUE(three.ok()) << three.status();
    if (three.ok()) {
      const strategy::StrategyDescription d = (*three)->Describe();
      EXPECT_EQ(d.stage, 3);
      EXPECT_TRUE(d.partitions_base_weights && d.partitions_gradients &&
                  d.partitions_optimizer_state);
    }
    EXPECT_EQ(strategy::MakeStrategy(5, {}, c, p.MakeParams()).status().code(),
              absl::StatusCode::kInvalidArgument);
    return absl::OkStatus();
  });
  EXPECT_TRUE(statuses[0].ok());
}

// A value read without draining the queue: Get() gives the value as it was when the read was
// made, not a later one, and on a GPU returns while work queued after the read still runs.
TEST(ZeroScalarRead, GivesTheValueAsItWasWhenTheReadWasMade) {
  EXPECT_EQ(strategy::ScalarRead().Get(), 0.0);
  at::Tensor cpu = at::full({1}, 2.5, at::kFloat);
  const strategy::ScalarRead cpu_read(cpu);
  cpu.fill_(7);
  EXPECT_EQ(cpu_read.Get(), 2.5);
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: the CPU read only";
  at::Tensor gpu = at::full({}, 3.25, at::dtype(at::kDouble).device(at::kCUDA));
  const strategy::ScalarRead gpu_read(gpu);
  gpu.fill_(5);
  const at::Tensor a = at::randn({8192, 8192}, at::dtype(at::kFloat).device(at::kCUDA));
  at::Tensor busy = a;
  for (int i = 0; i < 20; ++i) busy = at::mm(busy, a).div_(8192);  // ~100 ms queued after it
  EXPECT_EQ(gpu_read.Get(), 3.25);
  const c10::impl::VirtualGuardImpl guard(at::kCUDA);
  EXPECT_FALSE(guard.getStream(gpu.device()).query())
      << "Get() waited for the work queued after the read";
  guard.getStream(gpu.device()).synchronize();
}

}  // namespace
}  // namespace qlora
