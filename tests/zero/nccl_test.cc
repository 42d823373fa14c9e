// NCCL communicator and strategies on GPUs (skipped without them): stages 0-2 on two GPUs equal
// one CPU process; a rank that never joins ends the non-blocking init with DEADLINE_EXCEEDED.
#include <cuda_runtime_api.h>

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/zero/synthetic_problem.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/nccl_communicator.h"

namespace qlora {
namespace {

using ::testing::HasSubstr;

int GpuCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

TEST(ZeroNccl, StagesOnTwoGpusMatchOneProcess) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  constexpr int kWorld = 2, kSteps = 6;
  testing::SyntheticProblem p;
  const std::vector<at::Tensor> reference = testing::ReferenceTrain(p, kSteps);
  for (int stage : {0, 1, 2}) {
    auto id = comm::MakeNcclUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    auto store = std::make_shared<comm::InMemoryRendezvousStore>();
    std::vector<std::vector<at::Tensor>> result(kWorld);
    std::vector<absl::Status> statuses(kWorld);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kWorld; ++rank) {
      threads.emplace_back([&, rank] {
        comm::NcclOptions o;
        o.rank = rank;
        o.world_size = kWorld;
        o.device = rank;
        o.unique_id = *id;
        o.store = store;
        o.prefix = "nccl/stage" + std::to_string(stage);
        auto c = comm::ConnectNccl(o);
        if (!c.ok()) { statuses[rank] = c.status(); return; }
        strategy::StrategyOptions so;
        so.adamw = p.adamw;
        so.max_grad_norm = p.max_grad_norm;
        so.bucket_elements = 40;
        auto s = strategy::MakeStrategy(stage, so, **c,
                                        p.MakeParams(rank, at::Device(at::kCUDA, rank)));
        if (!s.ok()) { statuses[rank] = s.status(); return; }
        statuses[rank] = testing::TrainSteps(p, **s, kWorld, rank, 0, kSteps);
        for (const auto& param : (*s)->params()) result[rank].push_back(param.tensor.detach().cpu());
      });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
      const double error = testing::MaxRelativeError(result[rank], reference);
      std::printf("nccl stage %d rank %d: max relative deviation from one CPU process %.3g\n",
                  stage, rank, error);
      // GPU transcendental functions and reductions differ from the CPU's by a few ulps.
      EXPECT_LE(error, 1e-5);
    }
  }
}

TEST(ZeroNccl, RankThatNeverJoinsEndsInitWithinTheDeadline) {
  if (GpuCount() < 1) GTEST_SKIP() << "needs a GPU";
  auto id = comm::MakeNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  comm::NcclOptions o;
  o.rank = 0;
  o.world_size = 2;  // rank 1 never comes
  o.unique_id = *id;
  o.init_timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto c = comm::ConnectNccl(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  // With a store the missing rank is named.
  o.store = std::make_shared<comm::InMemoryRendezvousStore>();
  o.prefix = "nccl/never";
  c = comm::ConnectNccl(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("rank 1 of 2 did not join"));
}

}  // namespace
}  // namespace qlora
