// Jobs on a real Ray cluster across two hosts. tests/service/ray_hosts.sh makes two network
// namespaces ("hosts" with their own addresses, joined by a bridge), starts a Ray head in one and
// a Ray node in the other (Ray from PyPI, scripts/requirements-ray.txt), and the coordinator runs
// in the root namespace with --ray-address. Asserted: ranks run on different hosts as placed, the
// adapter is bit-identical to the same job on local workers (stages 0, 1, 2), a remote rank's log
// reaches `qloractl logs`, cancel ends every worker on both hosts within 5 s, a lost host fails
// the job naming the rank and the host, and a coordinator killed mid-job resumes the job on the
// cluster bit-identically. Needs root (CI runs as root); skipped without it or without
// $QLORA_RAYENV (scripts/test.sh sets it).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_harness.h"
#include "tests/util/files.h"
#include "tests/util/job_yaml.h"

namespace qlora::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;


// The original job file with the trainer and data sections of `training` and, on the cluster,
// its backend set for CPU workers placed with `placement`.
std::string Job(int workers, int stage, bool on_ray, const std::string& placement, const TestTraining& training) {
  std::string yaml = OriginalJobYaml(on_ray);
  const std::string old_backend = yaml.substr(yaml.find("backend:"), yaml.find("\ntrainer:") - yaml.find("backend:"));
  const std::string backend = absl::StrCat(
      "backend:\n  type: ", on_ray ? "ray" : "local", "\n  trainer:\n    use_gpu: false\n    num_workers: ", workers,
      on_ray ? absl::StrCat("\n    placement_strategy: ", placement) : "",
      "\n    strategy: {type: deepspeed, zero_optimization: {stage: ", stage, "}}");
  yaml.replace(yaml.find(old_backend), old_backend.size(), backend);
  yaml = yaml.substr(0, yaml.find("\ntrainer:") + 1);
  return absl::StrCat(yaml, TrainingYaml(training));
}

const TestTraining kShortTraining = ShortTraining();
const TestTraining kLongTraining = {
    .gradient_accumulation_steps = 1, .train_steps = 100000, .more_trainer = "max_restarts: 0"};

class RayClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* rayenv = getenv("QLORA_RAYENV");
    if (geteuid() != 0) {
      skip_ = "needs root for network namespaces";
      return;
    }
    if (rayenv == nullptr || *rayenv == '\0') {
      skip_ = "QLORA_RAYENV is not set (scripts/test.sh sets it)";
      return;
    }
    rayenv_ = rayenv;
    net_ = 20 + getpid() % 200;
    dir_ = MakeTempDir("qlora-ray-");
    Hosts("down");
    CommandResult up = Hosts(absl::StrCat("up ", net_, " ", dir_, " ", rayenv_), /*with_net=*/false);
    ASSERT_EQ(up.exit_code, 0) << up.output;
    dashboard_ = std::string(absl::StripAsciiWhitespace(up.output.substr(up.output.rfind("http://"))));
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) {
      Hosts(absl::StrCat("down ", net_, " ", dir_), false);
      fs::remove_all(dir_);
    }
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_FALSE(dashboard_.empty()) << "the Ray cluster did not start";
  }

  static CommandResult Hosts(const std::string& args, bool with_net = true) {
    const std::string script = SourceDir() + "/tests/service/ray_hosts.sh";
    if (!with_net) return RunCommand(absl::StrCat(script, " ", args, " 2>&1"));
    const size_t space = args.find(' ');
    return RunCommand(absl::StrCat(script, " ", args.substr(0, space), " ", net_,
                                   space == std::string::npos ? "" : args.substr(space), " 2>&1"));
  }
  static std::string Address(int index) { return absl::StrCat("10.77.", net_, ".", index); }

  // A coordinator in the root namespace whose Ray jobs run on the cluster.
  std::unique_ptr<CoordinatorProcess> RayCoordinator(const std::string& state, const std::string& extra = "") {
    return std::make_unique<CoordinatorProcess>(
        state, 1,
        absl::StrCat("--address 0.0.0.0:0 --insecure --advertise-address ", Address(254), ":0 --ray-address ",
                     dashboard_, " --ray-python ", rayenv_, "/bin/python3 ", extra));
  }

  // The qlora-worker processes running in host `host` (a or b).
  static int WorkersOn(const std::string& host) {
    int n = 0;
    for (absl::string_view pid : absl::StrSplit(Hosts("pids " + host).output, '\n', absl::SkipWhitespace())) {
      const std::string cmdline = ReadFile(absl::StrCat("/proc/", absl::StripAsciiWhitespace(pid), "/cmdline"));
      if (cmdline.find("qlora-worker") != std::string::npos) ++n;
    }
    return n;
  }

  v1::Job Submit(CoordinatorProcess& c, const std::string& yaml) {
    grpc::Status s;
    v1::Job job = SubmitJob(c, yaml, &s);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  // Runs `yaml` to the end on `c`; returns the adapter's bytes ("" when it failed).
  std::string RunToEnd(CoordinatorProcess& c, const std::string& yaml, v1::Job* out = nullptr) {
    v1::Job job = Submit(c, yaml);
    job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 400);
    if (out != nullptr) *out = job;
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
    if (job.state() != v1::JOB_STATE_SUCCEEDED) return "";
    return ReadFile(job.adapter_path() + "/adapter_model.safetensors");
  }

  static inline std::string skip_, rayenv_, dir_, dashboard_;
  static inline int net_ = 0;
};

// Stage 2 on 2 CPU workers placed STRICT_SPREAD: one rank per host, the adapter equal byte for
// byte to the same job on 2 local workers; the remote rank's log reaches qloractl.
TEST_F(RayClusterTest, StrictSpreadRanksRunOnTwoHostsAndMatchLocalWorkers) {
  CoordinatorProcess local(dir_ + "/local-2", 2);
  ASSERT_TRUE(local.started());
  const std::string expected = RunToEnd(local, Job(2, 2, false, "", kShortTraining));
  ASSERT_FALSE(expected.empty());

  const std::string state = dir_ + "/ray-2";
  auto c = RayCoordinator(state);
  ASSERT_TRUE(c->started());
  const std::string job_file = state + "/job.yaml";
  WriteFile(job_file, Job(2, 2, true, "STRICT_SPREAD", kShortTraining));
  CommandResult validate = c->Ctl(absl::StrCat("validate --remote ", job_file, " --dataset ", TrainData()));
  EXPECT_THAT(validate.output, HasSubstr("runs on: the Ray cluster at " + dashboard_)) << validate.output;
  v1::Job job;
  const std::string got = RunToEnd(*c, Job(2, 2, true, "STRICT_SPREAD", kShortTraining), &job);
  ASSERT_FALSE(got.empty());
  EXPECT_TRUE(got == expected) << "the adapter trained on the cluster differs from the local one";
  // Written by rank 0 in a Ray job (whose raylet's umask is the system's), yet private: the
  // workers apply the coordinator's --state-umask (077).
  for (const std::string& path : {job.adapter_path(), job.adapter_path() + "/adapter_model.safetensors",
                                  job.output_dir() + "/metrics.jsonl"}) {
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 077, 0u) << path << " has mode " << std::oct << (st.st_mode & 0777);
  }
  const std::string events = StoredEvents(state, job.id());
  EXPECT_THAT(events, HasSubstr("host " + Address(1))) << events;
  EXPECT_THAT(events, HasSubstr("host " + Address(2))) << events;
  // The remote rank's output arrives through the Ray job's log, a moment after the rank reported.
  CommandResult logs;
  EXPECT_TRUE(WaitUntil([&] { return (logs = c->Ctl("logs " + job.id() + " --rank 1")).output.find("[rank 1] done") !=
                                     std::string::npos; }, 15)) << logs.output;
  EXPECT_THAT(logs.output, HasSubstr(absl::StrCat("started on 10.77.", net_, "."))) << logs.output;
}

// Stages 0 and 1 on 4 workers, 2 per host (4 bundles of 1 CPU on 2 hosts of 2 CPUs).
TEST_F(RayClusterTest, FourWorkersTwoPerHostMatchLocalWorkersAtStagesZeroAndOne) {
  CoordinatorProcess local(dir_ + "/local-4", 4);
  ASSERT_TRUE(local.started());
  auto c = RayCoordinator(dir_ + "/ray-4");
  ASSERT_TRUE(c->started());
  for (int stage : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    const std::string expected = RunToEnd(local, Job(4, stage, false, "", kShortTraining));
    v1::Job job;
    const std::string got = RunToEnd(*c, Job(4, stage, true, "SPREAD", kShortTraining), &job);
    ASSERT_FALSE(got.empty());
    EXPECT_TRUE(got == expected) << "the adapter trained on the cluster differs from the local one";
    const std::string events = StoredEvents(dir_ + "/ray-4", job.id());
    EXPECT_THAT(events, HasSubstr("host " + Address(1)));
    EXPECT_THAT(events, HasSubstr("host " + Address(2)));
  }
}

// qloractl logs -f follows a remote rank while it runs; cancel ends every worker on both hosts.
TEST_F(RayClusterTest, RemoteLogsFollowAndCancelEndsEveryWorkerWithinFiveSeconds) {
  auto c = RayCoordinator(dir_ + "/ray-cancel");
  ASSERT_TRUE(c->started());
  v1::Job job = Submit(*c, Job(2, 2, true, "STRICT_SPREAD", kLongTraining));
  ASSERT_TRUE(WaitUntil([&] { return c->GetJob(job.id()).progress_size() == 2 &&
                                     c->GetJob(job.id()).progress(1).step() > 0; }, 240))
      << c->GetJob(job.id()).state_message();
  EXPECT_EQ(WorkersOn("a"), 1);
  EXPECT_EQ(WorkersOn("b"), 1);
  CommandResult follow = RunCommand(absl::StrCat("timeout 4 ", BinaryDir(), "/cli/qloractl --address ",
                                                 c->address(), " logs -f ", job.id(), " --rank 1"));
  EXPECT_THAT(follow.output, HasSubstr("[rank 1]")) << follow.output;
  CommandResult cancel = c->Ctl("cancel " + job.id());
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  const auto cancelled_at = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitUntil([&] { return WorkersOn("a") + WorkersOn("b") == 0; }, 5))
      << WorkersOn("a") << " + " << WorkersOn("b") << " workers still run 5 s after the cancel";
  printf("workers on both hosts gone %.2f s after the cancel\n",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled_at).count());
  EXPECT_EQ(c->GetJob(job.id()).state(), v1::JOB_STATE_CANCELLED);
}

// A coordinator killed mid-job: restarted, it stops the old Ray job, queues the job again, and
// it resumes on the cluster from its last checkpoint, ending bit-identical to an uninterrupted run.
TEST_F(RayClusterTest, CoordinatorKilledMidJobResumesOnTheClusterBitIdentically) {
  const std::string yaml = Job(2, 2, true, "STRICT_SPREAD",
                               {.gradient_accumulation_steps = 1, .train_steps = 60, .steps_per_checkpoint = 20});
  const std::string state = dir_ + "/ray-resume";
  std::string id;
  {
    auto c = RayCoordinator(state);
    ASSERT_TRUE(c->started());
    v1::Job job = Submit(*c, yaml);
    id = job.id();
    ASSERT_TRUE(WaitUntil([&] { return CheckpointWritten(job.output_dir(), 20); }, 300)) << "no checkpoint";
    ASSERT_NE(c->GetJob(id).state(), v1::JOB_STATE_SUCCEEDED) << "finished before the kill";
    c->Stop(SIGKILL);
  }
  auto c = RayCoordinator(state);
  ASSERT_TRUE(c->started());
  v1::Job resumed = c->WaitForState(id, {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 400);
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.state_message();
  // The remote rank's output arrives through the Ray job's log, a moment after the rank reported.
  CommandResult logs;
  EXPECT_TRUE(WaitUntil([&] { return (logs = c->Ctl("logs " + id + " --rank 0")).output.find(
                                         "resumed from") != std::string::npos; }, 15))
      << logs.output;
  const std::string a = ReadFile(resumed.adapter_path() + "/adapter_model.safetensors");
  const std::string b = RunToEnd(*c, yaml);
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed run's adapter differs from the uninterrupted run's";
}

// Elastic on the cluster: 2 workers, one per host (STRICT_SPREAD), min_workers 1: host b lost for
// good, the job restarts on the one host left (the placement group of 1 bundle fits), re-partitions
// the checkpoint and finishes; the events say so. Host b's node comes back for the next test.
TEST_F(RayClusterTest, ElasticJobGoesOnOnTheHostThatRemains) {
  const std::string state = dir_ + "/ray-elastic";
  // The restart must see the cluster without host b: Ray marks a node dead after its health
  // checks fail (~15 s), and the coordinator reads the cluster's capacity every 2 s.
  auto c = RayCoordinator(state, "--restart-backoff-s 30");
  ASSERT_TRUE(c->started());
  std::string yaml = Job(2, 2, true, "STRICT_SPREAD",
                         {.gradient_accumulation_steps = 1, .train_steps = 400, .steps_per_checkpoint = 5,
                          .more_trainer = "max_restarts: 1"});
  const std::string workers = "    num_workers: 2\n";
  yaml.replace(yaml.find(workers), workers.size(), workers + "    min_workers: 1\n");
  v1::Job job = Submit(*c, yaml);
  ASSERT_TRUE(WaitUntil([&] { return CheckpointWritten(job.output_dir(), 5); }, 240))
      << c->GetJob(job.id()).state_message();
  Hosts("kill-host b");
  v1::Job done = c->WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 400);
  const std::string events = StoredEvents(state, job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_message() << "\n" << events;
  EXPECT_THAT(events, HasSubstr("RESTARTING")) << events;
  EXPECT_THAT(events, HasSubstr("ELASTIC_RESIZE: continuing on 1 of 2 workers (min_workers 1): "
                                "gradient_accumulation_steps 1 -> 2 keeps the global batch")) << events;
  EXPECT_EQ(done.progress_size(), 1);
  CommandResult back = Hosts(absl::StrCat("add-node ", dir_, " ", rayenv_));
  EXPECT_EQ(back.exit_code, 0) << back.output;
}

// A dataset that one host lacks (DIR/hidden-on-b is empty for host b's processes): the start fails
// with a message naming the host and the path, and is not retried (it would fail the same way).
TEST_F(RayClusterTest, ADatasetAHostLacksFailsNamingTheHostAndThePath) {
  const std::string hidden = dir_ + "/hidden-on-b/train.jsonl";
  fs::copy_file(TrainData(), hidden, fs::copy_options::overwrite_existing);
  auto c = RayCoordinator(dir_ + "/ray-hidden");
  ASSERT_TRUE(c->started());
  grpc::Status submitted;
  const v1::Job job = SubmitJob(*c, Job(2, 2, true, "STRICT_SPREAD", kShortTraining), &submitted, hidden);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  v1::Job failed = c->WaitForState(job.id(), {v1::JOB_STATE_FAILED, v1::JOB_STATE_SUCCEEDED}, 300);
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED) << failed.state_message();
  EXPECT_THAT(failed.state_message(), HasSubstr("on host " + Address(2))) << failed.state_message();
  EXPECT_THAT(failed.state_message(), HasSubstr(hidden)) << failed.state_message();
}

// A host lost mid-job (every process on it killed, as a machine that dies): the job fails within
// the heartbeat timeout, naming the rank and the host. Last: it takes host b's Ray node down
// (and brings it back).
TEST_F(RayClusterTest, LostHostFailsTheJobNamingRankAndHost) {
  auto c = RayCoordinator(dir_ + "/ray-lost", "--heartbeat-timeout-s 15");
  ASSERT_TRUE(c->started());
  v1::Job job = Submit(*c, Job(2, 2, true, "STRICT_SPREAD", kLongTraining));
  ASSERT_TRUE(WaitUntil([&] { return c->GetJob(job.id()).state() == v1::JOB_STATE_RUNNING; }, 240))
      << c->GetJob(job.id()).state_message();
  const auto lost_at = std::chrono::steady_clock::now();
  Hosts("kill-host b");
  v1::Job failed = c->WaitForState(job.id(), {v1::JOB_STATE_FAILED, v1::JOB_STATE_SUCCEEDED}, 60);
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED) << failed.state_message();
  printf("failed %.1f s after host b was lost: %s\n",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - lost_at).count(),
         failed.state_message().c_str());
  // Which rank ran on host b is the placement group's choice: the message names it with the host.
  EXPECT_THAT(failed.state_message(), ::testing::ContainsRegex(absl::StrCat("rank [01] \\(host ", Address(2))));
  EXPECT_TRUE(WaitUntil([&] { return WorkersOn("a") == 0; }, 10)) << "rank 0 outlived the failed job";
  CommandResult back = Hosts(absl::StrCat("add-node ", dir_, " ", rayenv_));
  EXPECT_EQ(back.exit_code, 0) << back.output;
}

}  // namespace
}  // namespace qlora::testing
