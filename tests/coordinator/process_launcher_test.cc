// PosixProcessLauncher with real processes (/bin/sh): exit codes, signals, the log file, the
// environment and the process group a worker runs in.
#include "coordinator/launch/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::PollUntil;
using testing::ReadFile;
using testing::TempDir;

class CoordinatorProcessLauncherTest : public ::testing::Test {
 protected:
  LaunchSpec Shell(const std::string& script, const std::string& log = "worker.log") {
    LaunchSpec spec;
    spec.argv = {"/bin/sh", "-c", script};
    spec.log_path = dir_.path() + "/" + log;
    return spec;
  }
  // Polls `pid` until it has ended (bounded); nullopt if it never did.
  std::optional<ExitInfo> WaitExit(pid_t pid) {
    std::optional<ExitInfo> exit;
    PollUntil([&] { return (exit = launcher_.Poll(pid)).has_value(); }, std::chrono::seconds(20));
    return exit;
  }
  TempDir dir_;
  PosixProcessLauncher launcher_;
};

TEST_F(CoordinatorProcessLauncherTest, ReportsTheExitCode) {
  absl::StatusOr<pid_t> pid = launcher_.Launch(Shell("exit 3"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ExitInfo> exit = WaitExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_FALSE(exit->signaled);
  EXPECT_EQ(exit->code, 3);
  EXPECT_EQ(exit->Describe(), "exit status 3");
  // Reaped: the pid is no longer this process's child.
  std::optional<ExitInfo> again = launcher_.Poll(*pid);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->code, -1);
}

TEST_F(CoordinatorProcessLauncherTest, PollDoesNotBlockWhileTheProcessRuns) {
  absl::StatusOr<pid_t> pid = launcher_.Launch(Shell("exec sleep 30"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(launcher_.Poll(*pid).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  launcher_.Signal(*pid, SIGKILL);
  EXPECT_TRUE(WaitExit(*pid).has_value());
}

TEST_F(CoordinatorProcessLauncherTest, ReportsTheSignalThatEndedIt) {
  absl::StatusOr<pid_t> pid = launcher_.Launch(Shell("exec sleep 30"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  launcher_.Signal(*pid, SIGKILL);
  std::optional<ExitInfo> exit = WaitExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->signaled);
  EXPECT_EQ(exit->code, SIGKILL);
  EXPECT_THAT(exit->Describe(), HasSubstr("signal 9"));
}

TEST_F(CoordinatorProcessLauncherTest, SigtermReachesTheWorkerThroughBlockedSignals) {
  // The coordinator blocks SIGTERM in its threads; the child must not inherit that mask.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  absl::StatusOr<pid_t> pid = launcher_.Launch(
      Shell("trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done", "trap.log"));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(pid.ok()) << pid.status();
  // The trap is in place once the shell says so (before it, SIGTERM would kill the shell).
  ASSERT_TRUE(PollUntil([&] { return ReadFile(dir_.path() + "/trap.log") == "ready\n"; }));
  launcher_.Signal(*pid, SIGTERM);
  std::optional<ExitInfo> exit = WaitExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_FALSE(exit->signaled) << exit->Describe();
  EXPECT_EQ(exit->code, 7);
}

TEST_F(CoordinatorProcessLauncherTest, StdoutAndStderrAreAppendedToTheLog) {
  absl::StatusOr<pid_t> first = launcher_.Launch(Shell("echo out-1; echo err-1 >&2"));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WaitExit(*first).has_value());
  absl::StatusOr<pid_t> second = launcher_.Launch(Shell("echo out-2"));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(WaitExit(*second).has_value());
  EXPECT_EQ(ReadFile(dir_.path() + "/worker.log"), "out-1\nerr-1\nout-2\n");
}

TEST_F(CoordinatorProcessLauncherTest, EnvironmentIsInheritedWithTheSpecOverriding) {
  LaunchSpec spec = Shell("echo \"[$CUDA_VISIBLE_DEVICES][$OMP_NUM_THREADS][$PATH]\"");
  spec.env["CUDA_VISIBLE_DEVICES"] = "";
  spec.env["OMP_NUM_THREADS"] = "3";
  absl::StatusOr<pid_t> pid = launcher_.Launch(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(WaitExit(*pid).has_value());
  const char* path = getenv("PATH");
  EXPECT_EQ(ReadFile(spec.log_path), absl::StrCat("[][3][", path ? path : "", "]\n"));
}

TEST_F(CoordinatorProcessLauncherTest, WorkerLeadsItsOwnProcessGroup) {
  // Signal() reaches the group: everything the worker started goes with it.
  absl::StatusOr<pid_t> pid = launcher_.Launch(Shell("exec sleep 30"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(getpgid(*pid), *pid);
  EXPECT_NE(getpgid(*pid), getpgrp());
  launcher_.Signal(*pid, SIGKILL);
  EXPECT_TRUE(WaitExit(*pid).has_value());
}

TEST_F(CoordinatorProcessLauncherTest, ExecFailureExits127WithAMessageInTheLog) {
  LaunchSpec spec;
  spec.argv = {dir_.path() + "/no-such-binary"};
  spec.log_path = dir_.path() + "/exec.log";
  absl::StatusOr<pid_t> pid = launcher_.Launch(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::optional<ExitInfo> exit = WaitExit(*pid);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->code, 127);
  EXPECT_THAT(ReadFile(spec.log_path), HasSubstr("exec of worker failed"));
}

TEST_F(CoordinatorProcessLauncherTest, RefusesAnEmptyCommandAndAnUnwritableLog) {
  LaunchSpec empty;
  empty.log_path = dir_.path() + "/x.log";
  EXPECT_EQ(launcher_.Launch(empty).status().code(), absl::StatusCode::kInvalidArgument);
  LaunchSpec bad_log = Shell("exit 0", "no/such/folder/x.log");
  absl::StatusOr<pid_t> pid = launcher_.Launch(bad_log);
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(pid.status().message(), HasSubstr("no/such/folder/x.log"));
}

// The launcher runs under the job manager's lock: a FIFO in the log's place (no reader: a plain
// open for writing would wait for one) is refused at once, and nothing is started.
TEST_F(CoordinatorProcessLauncherTest, LogThatIsAFifoIsRefusedWithoutBlocking) {
  LaunchSpec spec = Shell("exit 0", "fifo.log");
  ASSERT_EQ(mkfifo(spec.log_path.c_str(), 0644), 0);
  absl::StatusOr<pid_t> pid = absl::UnknownError("not returned");
  absl::Notification returned;
  std::thread launch([&] {
    pid = launcher_.Launch(spec);
    returned.Notify();
  });
  const bool in_time = returned.WaitForNotificationWithTimeout(absl::Seconds(1));
  int reader = -1;
  if (!in_time) reader = open(spec.log_path.c_str(), O_RDONLY | O_NONBLOCK);  // lets it go on
  launch.join();
  if (reader >= 0) close(reader);
  if (pid.ok()) WaitExit(*pid);
  EXPECT_TRUE(in_time) << "Launch blocked opening a FIFO as the log";
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(pid.status().message(), HasSubstr("fifo.log"));
}

}  // namespace
}  // namespace qlora::coordinator
