// WorkerGroup with real processes (/bin/sh through PosixProcessLauncher): launching, reaping,
// SIGTERM on Stop, SIGKILL only once the grace has passed, and the heartbeat bookkeeping.
#include "coordinator/worker_group.h"

#include <signal.h>

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::IsEmpty;
using testing::PollUntil;
using testing::ReadFile;
using testing::TempDir;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

class CoordinatorWorkerGroupTest : public ::testing::Test {
 protected:
  LaunchSpec Shell(const std::string& script, const std::string& log) {
    LaunchSpec spec;
    spec.argv = {"/bin/sh", "-c", script};
    spec.log_path = dir_.path() + "/" + log;
    return spec;
  }
  // Reaps until `n` exits were seen (bounded).
  std::vector<WorkerExit> ReapUntil(WorkerGroup& group, size_t n) {
    std::vector<WorkerExit> exits;
    PollUntil([&] {
      for (WorkerExit& e : group.Reap()) exits.push_back(e);
      return exits.size() >= n;
    });
    return exits;
  }
  TempDir dir_;
  PosixProcessLauncher launcher_;
};

TEST_F(CoordinatorWorkerGroupTest, ReapsEachExitOnceWithItsRankAndSlot) {
  WorkerGroup group(&launcher_);
  ASSERT_TRUE(group.Launch(0, 4, "token-0", Shell("exit 0", "r0.log"), kT0).ok());
  ASSERT_TRUE(group.Launch(1, 6, "token-1", Shell("exit 5", "r1.log"), kT0).ok());
  EXPECT_EQ(group.size(), 2);
  ASSERT_NE(group.FindByToken("token-1"), nullptr);
  EXPECT_EQ(group.FindByToken("token-1")->rank, 1);
  EXPECT_EQ(group.FindByToken("nope"), nullptr);
  group.FindByToken("token-0")->completed = true;

  std::vector<WorkerExit> exits = ReapUntil(group, 2);
  ASSERT_EQ(exits.size(), 2u);
  std::sort(exits.begin(), exits.end(), [](const WorkerExit& a, const WorkerExit& b) { return a.rank < b.rank; });
  EXPECT_EQ(exits[0].slot, 4);
  EXPECT_TRUE(exits[0].completed);
  EXPECT_EQ(exits[0].info.code, 0);
  EXPECT_EQ(exits[1].slot, 6);
  EXPECT_FALSE(exits[1].completed);
  EXPECT_EQ(exits[1].info.code, 5);
  EXPECT_FALSE(group.AnyAlive());
  EXPECT_THAT(group.Reap(), IsEmpty());  // an exit is reported once
}

TEST_F(CoordinatorWorkerGroupTest, StopSendsSigtermAndSigkillOnlyAfterTheGrace) {
  WorkerGroup group(&launcher_);
  // Rank 0 ends on SIGTERM; rank 1 ignores it, as a worker stuck in a collective might.
  ASSERT_TRUE(group.Launch(0, 0, "t0", Shell("echo ready; exec sleep 60", "r0.log"), kT0).ok());
  ASSERT_TRUE(group.Launch(1, 1, "t1", Shell("trap '' TERM; echo ready; while :; do sleep 0.05; done", "r1.log"), kT0).ok());
  ASSERT_TRUE(PollUntil([&] {
    return ReadFile(dir_.path() + "/r0.log") == "ready\n" && ReadFile(dir_.path() + "/r1.log") == "ready\n";
  }));
  EXPECT_FALSE(group.stopping());
  group.Stop(kT0 + absl::Seconds(3));
  group.Stop(kT0 + absl::Hours(1));  // the first Stop counts
  EXPECT_TRUE(group.stopping());

  std::vector<WorkerExit> exits = ReapUntil(group, 1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].rank, 0);
  EXPECT_TRUE(exits[0].info.signaled);
  EXPECT_EQ(exits[0].info.code, SIGTERM);

  group.KillOverdue(kT0 + absl::Seconds(2));  // within the grace: nothing
  EXPECT_FALSE(PollUntil([&] { return !group.Reap().empty(); }, std::chrono::milliseconds(200)));
  EXPECT_TRUE(group.AnyAlive());
  group.KillOverdue(kT0 + absl::Seconds(3));
  exits = ReapUntil(group, 1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].rank, 1);
  EXPECT_EQ(exits[0].info.code, SIGKILL);
  EXPECT_FALSE(group.AnyAlive());
}

TEST_F(CoordinatorWorkerGroupTest, KillAllAndReapKilledLeaveNothingRunning) {
  WorkerGroup group(&launcher_);
  ASSERT_TRUE(group.Launch(0, 0, "t0", Shell("trap '' TERM; while :; do sleep 0.05; done", "r0.log"), kT0).ok());
  ASSERT_TRUE(group.Launch(1, 1, "t1", Shell("exec sleep 60", "r1.log"), kT0).ok());
  group.KillAll();
  group.ReapKilled();
  EXPECT_FALSE(group.AnyAlive());
  for (const WorkerProcess& w : group.workers()) EXPECT_TRUE(w.exited) << "rank " << w.rank;
}

TEST_F(CoordinatorWorkerGroupTest, HeartbeatBookkeeping) {
  WorkerGroup group(&launcher_);
  ASSERT_TRUE(group.Launch(0, 0, "t0", Shell("exec sleep 60", "r0.log"), kT0).ok());
  ASSERT_TRUE(group.Launch(1, 1, "t1", Shell("exec sleep 60", "r1.log"), kT0).ok());
  EXPECT_EQ(group.SilentSince(kT0), nullptr);  // heard of at launch
  group.FindByToken("t0")->last_heartbeat = kT0 + absl::Seconds(50);
  const WorkerProcess* silent = group.SilentSince(kT0 + absl::Seconds(10));
  ASSERT_NE(silent, nullptr);
  EXPECT_EQ(silent->rank, 1);
  group.FindByToken("t1")->completed = true;  // a rank that finished needs no heartbeat
  EXPECT_EQ(group.SilentSince(kT0 + absl::Seconds(10)), nullptr);
  EXPECT_FALSE(group.AllCompleted());
  group.FindByToken("t0")->completed = true;
  EXPECT_TRUE(group.AllCompleted());
  group.TouchAll(kT0 + absl::Minutes(5));
  for (const WorkerProcess& w : group.workers()) EXPECT_EQ(w.last_heartbeat, kT0 + absl::Minutes(5));
  group.KillAll();
  group.ReapKilled();
}

TEST_F(CoordinatorWorkerGroupTest, FailedLaunchAddsNoWorker) {
  WorkerGroup group(&launcher_);
  LaunchSpec bad = Shell("exit 0", "no/such/folder/r0.log");
  absl::Status s = group.Launch(0, 0, "t0", bad, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(group.empty());
  EXPECT_EQ(group.FindByToken("t0"), nullptr);
}

}  // namespace
}  // namespace qlora::coordinator
