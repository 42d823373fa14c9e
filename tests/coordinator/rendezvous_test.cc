// Rendezvous: the registration wait, the NCCL id relay and the Gloo store of one job generation,
// with real threads and real (short) deadlines.
#include "coordinator/jobs/rendezvous.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGeneration = 42;

RendezvousOptions Options(int world, bool relay_nccl_id = false) {
  RendezvousOptions o;
  o.generation = kGeneration;
  o.world_size = world;
  o.relay_nccl_id = relay_nccl_id;
  return o;
}

absl::Time Soon() { return absl::Now() + absl::Milliseconds(50); }
absl::Time Later() { return absl::Now() + absl::Seconds(30); }

TEST(CoordinatorRendezvousTest, AwaitPeersNamesTheRanksThatHaveNotRegistered) {
  Rendezvous r(Options(4));
  ASSERT_TRUE(r.Register(0).ok());
  ASSERT_TRUE(r.Register(2).ok());
  EXPECT_FALSE(r.AllRegistered());
  EXPECT_EQ(r.UnregisteredRanks(), "1, 3");
  absl::StatusOr<std::string> got = r.AwaitPeers(0, Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("rank(s) 1, 3"));
}

TEST(CoordinatorRendezvousTest, AwaitPeersReturnsOnceTheLastRankRegisters) {
  Rendezvous r(Options(2));
  ASSERT_TRUE(r.Register(0).ok());
  absl::StatusOr<std::string> got = absl::UnknownError("not returned");
  absl::Notification returned;
  std::thread waiter([&] {
    got = r.AwaitPeers(0, Later());
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_TRUE(r.Register(1).ok());
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");  // a CPU job relays no NCCL id
  EXPECT_TRUE(r.AllRegistered());
  EXPECT_EQ(r.UnregisteredRanks(), "");
}

TEST(CoordinatorRendezvousTest, AStartupTokenRegistersOnce) {
  Rendezvous r(Options(2));
  ASSERT_TRUE(r.Register(1).ok());
  const absl::Status again = r.Register(1);
  EXPECT_EQ(again.code(), absl::StatusCode::kPermissionDenied) << again;
  EXPECT_THAT(std::string(again.message()), ::testing::HasSubstr("used once"));
}

TEST(CoordinatorRendezvousTest, RegisteringARankOutsideTheWorldIsRefused) {
  Rendezvous r(Options(2));
  EXPECT_EQ(r.Register(2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.UnregisteredRanks(), "0, 1");
}

TEST(CoordinatorRendezvousTest, OtherRanksWaitForTheNcclIdThatRankZeroPublishes) {
  Rendezvous r(Options(2, /*relay_nccl_id=*/true));
  ASSERT_TRUE(r.Register(0).ok());
  ASSERT_TRUE(r.Register(1).ok());
  // Rank 0 makes the id: it does not wait for it.
  EXPECT_TRUE(r.AwaitPeers(0, Soon()).ok());
  absl::StatusOr<std::string> early = r.AwaitPeers(1, Soon());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.status().message(), HasSubstr("NCCL id"));

  absl::StatusOr<std::string> got = absl::UnknownError("not returned");
  std::thread waiter([&] { got = r.AwaitPeers(1, Later()); });
  EXPECT_EQ(r.PublishNcclId(1, "not-rank-0").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(r.PublishNcclId(0, std::string("\x01\x00\x02", 3)).ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("\x01\x00\x02", 3));
}

TEST(CoordinatorRendezvousTest, StoreGetWaitsForTheKeyAnotherRankSets) {
  Rendezvous r(Options(2));
  absl::StatusOr<std::string> got = absl::UnknownError("not returned");
  absl::Notification returned;
  std::thread waiter([&] {
    got = r.Get(kGeneration, "rank/1/addr", Later());
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_TRUE(r.Set(kGeneration, "rank/1/addr", "10.0.0.2:1234").ok());
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "10.0.0.2:1234");
  // A later Set replaces the value.
  ASSERT_TRUE(r.Set(kGeneration, "rank/1/addr", "other").ok());
  EXPECT_EQ(*r.Get(kGeneration, "rank/1/addr", Soon()), "other");
}

TEST(CoordinatorRendezvousTest, StoreGetOfAnUnsetKeyExpiresNamingTheKey) {
  Rendezvous r(Options(2));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = r.Get(kGeneration, "never", absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("'never'"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));  // it waited, up to the deadline
}

TEST(CoordinatorRendezvousTest, AnotherGenerationCanNeitherReadNorWrite) {
  Rendezvous r(Options(2));
  ASSERT_TRUE(r.Set(kGeneration, "k", "current").ok());
  absl::Status set = r.Set(kGeneration - 1, "k", "stale");
  EXPECT_EQ(set.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(set.message(), HasSubstr("stale rendezvous generation"));
  EXPECT_EQ(r.Get(kGeneration - 1, "k", Soon()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*r.Get(kGeneration, "k", Soon()), "current");
}

TEST(CoordinatorRendezvousTest, CloseEndsEveryWaitWithItsReason) {
  Rendezvous r(Options(2, /*relay_nccl_id=*/true));
  absl::StatusOr<std::string> peers = absl::UnknownError("not returned");
  absl::StatusOr<std::string> key = absl::UnknownError("not returned");
  std::thread a([&] { peers = r.AwaitPeers(1, Later()); });
  std::thread b([&] { key = r.Get(kGeneration, "k", Later()); });
  r.Close("job job-000001 has ended");
  r.Close("a second reason is ignored");
  a.join();
  b.join();
  EXPECT_EQ(peers.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(peers.status().message(), "job job-000001 has ended");
  EXPECT_EQ(key.status().code(), absl::StatusCode::kAborted);
  // Later waits end at once.
  EXPECT_EQ(r.AwaitPeers(0, Later()).status().code(), absl::StatusCode::kAborted);
}

TEST(CoordinatorRendezvousTest, AKeySetBeforeCloseIsStillReturned) {
  Rendezvous r(Options(1));
  ASSERT_TRUE(r.Set(kGeneration, "k", "v").ok());
  r.Close("ended");
  absl::StatusOr<std::string> got = r.Get(kGeneration, "k", Later());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  EXPECT_EQ(r.Get(kGeneration, "unset", Later()).status().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace qlora::coordinator
