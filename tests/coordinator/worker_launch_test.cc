// The launch spec of one worker: its command line, what it sees of the GPUs and CPU cores, and
// where its output goes.
#include "coordinator/launch/worker_launch.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

using ::testing::ElementsAre;

WorkerLaunchRequest Request() {
  WorkerLaunchRequest r;
  r.worker_binary = "/opt/qlora/qlora-worker";
  r.coordinator_address = "127.0.0.1:7000";
  r.job_id = "job-000003";
  r.job_dir = "/state/jobs/job-000003";
  r.startup_token = "secret-token";
  r.rank = 1;
  r.world_size = 4;
  return r;
}

TEST(CoordinatorWorkerLaunchTest, GpuWorkerSeesOnlyItsGpu) {
  WorkerLaunchRequest r = Request();
  r.use_gpu = true;
  r.slot = 6;
  LaunchSpec spec = BuildWorkerLaunchSpec(r);
  EXPECT_THAT(spec.argv, ElementsAre("/opt/qlora/qlora-worker", "--coordinator", "127.0.0.1:7000",
                                     "--job", "job-000003", "--rank", "1", "--device=cuda"));
  // The token is in the worker's environment (owner-readable), never in its argv.
  EXPECT_EQ(spec.env.at(kWorkerTokenVariable), "secret-token");
  for (const std::string& arg : spec.argv) EXPECT_EQ(arg.find("secret-token"), std::string::npos);
  EXPECT_EQ(spec.env.at("CUDA_VISIBLE_DEVICES"), "6");
  EXPECT_EQ(spec.env.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(spec.log_path, "/state/jobs/job-000003/logs/rank-1.log");
}

TEST(CoordinatorWorkerLaunchTest, CpuWorkerSeesNoGpuAndGetsItsThreads) {
  WorkerLaunchRequest r = Request();
  r.use_gpu = false;
  r.slot = 1;
  r.threads_per_worker = 4;
  LaunchSpec spec = BuildWorkerLaunchSpec(r);
  EXPECT_EQ(spec.argv.back(), "--device=cpu");
  EXPECT_EQ(spec.env.at("CUDA_VISIBLE_DEVICES"), "");  // set, and empty: no GPU at all
  EXPECT_EQ(spec.env.at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(spec.log_path, WorkerLogPath("/state/jobs/job-000003", 1));
}

// With roots the worker is told what to confine itself to (folder names, never secrets).
TEST(CoordinatorWorkerLaunchTest, ConfinedWorkersAreToldTheirFolders) {
  WorkerLaunchRequest r = Request();
  EXPECT_THAT(BuildWorkerLaunchSpec(r).argv, ::testing::Not(::testing::Contains(
                                                 ::testing::HasSubstr("--confine"))));
  r.confine_read = {"/srv/data", "/srv/models"};
  r.confine_write = {"/srv/out/job-000003"};
  const LaunchSpec spec = BuildWorkerLaunchSpec(r);
  EXPECT_THAT(spec.argv, ::testing::Contains("--confine_read=/srv/data,/srv/models"));
  EXPECT_THAT(spec.argv, ::testing::Contains("--confine_write=/srv/out/job-000003"));
}

TEST(CoordinatorWorkerLaunchTest, CpuWorkerGetsAtLeastOneThread) {
  WorkerLaunchRequest r = Request();
  r.threads_per_worker = 0;
  EXPECT_EQ(BuildWorkerLaunchSpec(r).env.at("OMP_NUM_THREADS"), "1");
}

TEST(CoordinatorWorkerLaunchTest, EachRankHasItsOwnLog) {
  EXPECT_EQ(WorkerLogPath("/s/jobs/job-000001", 0), "/s/jobs/job-000001/logs/rank-0.log");
  EXPECT_EQ(WorkerLogPath("/s/jobs/job-000001", 3), "/s/jobs/job-000001/logs/rank-3.log");
}

}  // namespace
}  // namespace qlora::coordinator
