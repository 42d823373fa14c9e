// Gloo communicator: collectives compute what the interface promises, and failures (a rank that
// never joins, a collective a rank never enters) end within the deadline naming the missing rank.
#include <thread>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "tests/zero/gloo_world.h"
#include "worker/comm/collective_failure.h"

namespace qlora {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(20);

at::Tensor RankValues(int rank, int64_t n, at::ScalarType type = at::kFloat) {
  return at::arange(n, at::TensorOptions().dtype(type)) * (rank + 1) + rank;
}

at::Tensor SumOverRanks(int world, int64_t n, at::ScalarType type = at::kFloat) {
  at::Tensor sum = at::zeros({n}, at::TensorOptions().dtype(type));
  for (int r = 0; r < world; ++r) sum += RankValues(r, n, type);
  return sum;
}

TEST(ZeroComm, CollectivesComputeTheirDefinition) {
  static constexpr int kWorld = 3;
  auto results = testing::RunGlooWorld(kWorld, [](int rank, comm::Communicator& c) {
    EXPECT_EQ(c.rank(), rank);
    EXPECT_EQ(c.world_size(), kWorld);
    // all-reduce, float and int64
    for (at::ScalarType type : {at::kFloat, at::kLong, at::kDouble}) {
      at::Tensor t = RankValues(rank, 1001, type);
      EXPECT_TRUE(c.AllReduceSum(t, kTimeout).ok());
      EXPECT_TRUE(at::equal(t, SumOverRanks(kWorld, 1001, type))) << c10::toString(type);
    }
    // reduce-scatter with unequal and empty parts, input untouched
    const std::vector<int64_t> counts = {5, 0, 8};
    at::Tensor input = RankValues(rank, 13);
    at::Tensor before = input.clone();
    at::Tensor output = at::full({counts[rank]}, -1.0f);
    EXPECT_TRUE(c.ReduceScatterSum(input, output, counts, kTimeout).ok());
    const int64_t offset = rank == 2 ? 5 : 0;
    EXPECT_TRUE(at::equal(output, SumOverRanks(kWorld, 13).slice(0, offset, offset + counts[rank])));
    EXPECT_TRUE(at::equal(input, before));
    // all-gather
    at::Tensor mine = at::full({4}, static_cast<float>(rank));
    at::Tensor all = at::empty({4 * kWorld});
    EXPECT_TRUE(c.AllGather(mine, all, kTimeout).ok());
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(at::equal(all.slice(0, 4 * r, 4 * r + 4), at::full({4}, static_cast<float>(r))));
    }
    // broadcast from a non-zero root
    at::Tensor b = RankValues(rank, 7);
    EXPECT_TRUE(c.Broadcast(b, 1, kTimeout).ok());
    EXPECT_TRUE(at::equal(b, RankValues(1, 7)));
    return c.Barrier(kTimeout);
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(ZeroComm, RejectsTensorsItCannotMove) {
  auto results = testing::RunGlooWorld(1, [](int, comm::Communicator& c) {
    at::Tensor strided = at::zeros({4, 4}).t();
    absl::Status s = c.AllReduceSum(strided, kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("all_reduce"), HasSubstr("rank 0")));
    s = c.AllReduceSum(at::zeros({3}, at::kInt), kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return absl::OkStatus();
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
}

TEST(ZeroComm, RankThatNeverJoinsIsNamedWithinTheDeadline) {
  auto store = std::make_shared<comm::InMemoryRendezvousStore>();
  static constexpr int kWorld = 3;
  const absl::Duration timeout = absl::Seconds(1);
  std::vector<absl::Status> results(2);
  std::vector<absl::Duration> took(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {  // rank 2 never starts
    threads.emplace_back([&, rank] {
      comm::GlooOptions options;
      options.rank = rank;
      options.world_size = kWorld;
      options.prefix = "never-joins";
      options.connect_timeout = timeout;
      const absl::Time start = absl::Now();
      results[rank] = comm::ConnectGloo(options, store).status();
      took[rank] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].code(), absl::StatusCode::kDeadlineExceeded) << results[rank];
    EXPECT_THAT(std::string(results[rank].message()), HasSubstr("rank 2 of 3 did not join"));
    EXPECT_LT(took[rank], timeout + absl::Milliseconds(500));
  }
}

TEST(ZeroComm, CollectiveThatNeverCompletesNamesTheMissingRank) {
  static constexpr int kWorld = 3;
  const absl::Duration timeout = absl::Seconds(2);
  absl::Notification others_done;
  std::atomic<int> finished{0};
  auto results = testing::RunGlooWorld(kWorld, [&](int rank, comm::Communicator& c) {
    if (rank == 1) {  // alive, but never enters the collective
      others_done.WaitForNotificationWithTimeout(absl::Seconds(30));
      return absl::OkStatus();
    }
    const absl::Time start = absl::Now();
    absl::Status s = c.AllReduceSum(at::ones({100}), timeout);
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()),
                AllOf(HasSubstr("all_reduce"), HasSubstr(absl::StrCat("gloo rank ", rank)),
                      HasSubstr("missing rank 1")));
    EXPECT_LT(took, timeout + absl::Milliseconds(500));
    absl::Status again = c.Barrier(timeout);
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    if (++finished == 2) others_done.Notify();
    return absl::OkStatus();
  });
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
}

TEST(ZeroComm, CollectiveFailuresAreWordedOnceForEveryBackend) {
  comm::CollectiveFailure f;
  f.where = "nccl all_reduce (rank 0 of 4)";
  f.sequence = 17;
  f.tensor = at::zeros({12});
  f.timed_out = true;
  f.timeout = absl::Seconds(30);
  f.absent = std::vector<int>{1, 3};
  f.detail = "nccl: watchdog";
  absl::Status s = comm::CollectiveFailureStatus(f);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "nccl all_reduce (rank 0 of 4) #17 of 12 Float did not complete within 30s; "
                         "missing ranks 1, 3 (never entered it or died) [nccl: watchdog]");
  f.timed_out = false;
  f.tensor = at::Tensor();  // a barrier carries no tensor
  f.absent.reset();
  s = comm::CollectiveFailureStatus(f);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "nccl all_reduce (rank 0 of 4) #17 failed; no store to tell which rank is "
                         "missing [nccl: watchdog]");
}

}  // namespace
}  // namespace qlora
