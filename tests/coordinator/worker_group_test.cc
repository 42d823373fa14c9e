// WorkerGroup with real processes (/bin/sh through LocalWorkerLauncher and PosixProcessLauncher):
// launching, reaping, SIGTERM on Stop, SIGKILL only once the grace has passed, a failed start
// leaving nothing running, and the heartbeat bookkeeping.
#include "coordinator/jobs/worker_group.h"

#include "coordinator/launch/local_worker_launcher.h"

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
  // Launches ranks 0..n-1 with `specs` on `slots` (tokens "t<rank>").
  absl::Status Launch(WorkerGroup& group, const std::vector<LaunchSpec>& specs, std::vector<int> slots = {}) {
    GroupLaunch launch;
    std::vector<std::string> tokens;
    for (size_t r = 0; r < specs.size(); ++r) {
      launch.ranks.push_back({static_cast<int>(r), slots.empty() ? static_cast<int>(r) : slots[r], specs[r]});
      tokens.push_back(absl::StrCat("t", r));
    }
    return group.Launch(&local_, launch, tokens, kT0);
  }
  TempDir dir_;
  PosixProcessLauncher processes_;
  LocalWorkerLauncher local_{&processes_, 0};
};

TEST_F(CoordinatorWorkerGroupTest, ReapsEachExitOnceWithItsRankAndSlot) {
  WorkerGroup group;
  ASSERT_TRUE(Launch(group, {Shell("exit 0", "r0.log"), Shell("exit 5", "r1.log")}, {4, 6}).ok());
  EXPECT_EQ(group.size(), 2);
  ASSERT_NE(group.FindByToken("t1"), nullptr);
  EXPECT_EQ(group.FindByToken("t1")->rank, 1);
  EXPECT_THAT(group.FindByToken("t1")->where, ::testing::StartsWith("pid "));
  EXPECT_EQ(group.FindByToken("nope"), nullptr);
  group.FindByToken("t0")->completed = true;

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
  WorkerGroup group;
  // Rank 0 ends on SIGTERM; rank 1 ignores it, as a worker stuck in a collective might.
  ASSERT_TRUE(Launch(group, {Shell("echo ready; exec sleep 60", "r0.log"),
                             Shell("trap '' TERM; echo ready; while :; do sleep 0.05; done", "r1.log")}).ok());
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
  WorkerGroup group;
  ASSERT_TRUE(Launch(group, {Shell("trap '' TERM; while :; do sleep 0.05; done", "r0.log"),
                             Shell("exec sleep 60", "r1.log")}).ok());
  group.KillAll();
  group.ReapKilled();
  EXPECT_FALSE(group.AnyAlive());
  for (const WorkerProcess& w : group.workers()) EXPECT_TRUE(w.exited) << "rank " << w.rank;
}

TEST_F(CoordinatorWorkerGroupTest, HeartbeatBookkeeping) {
  WorkerGroup group;
  ASSERT_TRUE(Launch(group, {Shell("exec sleep 60", "r0.log"), Shell("exec sleep 60", "r1.log")}).ok());
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

TEST_F(CoordinatorWorkerGroupTest, FailedLaunchAddsNoWorkerAndLeavesNothingRunning) {
  WorkerGroup group;
  // Rank 0 starts (and would run for a minute); rank 1 cannot: the start fails as a whole.
  absl::Status s = Launch(group, {Shell("echo $$ > " + dir_.path() + "/r0.pid; exec sleep 60", "r0.log"),
                                  Shell("exit 0", "no/such/folder/r1.log")});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("rank 1"));
  EXPECT_TRUE(group.empty());
  EXPECT_EQ(group.FindByToken("t0"), nullptr);
  const std::string pid = ReadFile(dir_.path() + "/r0.pid");
  if (!pid.empty()) EXPECT_NE(::kill(std::stoi(pid), 0), 0) << "rank 0 of the failed start still runs";
}

}  // namespace
}  // namespace qlora::coordinator
