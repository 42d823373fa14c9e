// PlanResume: which job can be continued, from which checkpoint, and what the coordinator says
// (or refuses) when the new job file differs from the continued job's.
#include "coordinator/jobs/resume_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/checkpoint_dirs.h"
#include "common/posix_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;
using testing::WriteFile;

constexpr char kResolved[] = R"(name: "first"
base_model: "/models/tiny"
dataset: "/data/train.jsonl"
validation_dataset: ""
output_dir: ""
adapter:
  type: lora
  r: 8
  alpha: 16
  dropout: 0.05
  target_modules: [q_proj, v_proj]
trainer:
  batch_size: 4
  learning_rate: 0.003
  epochs: 3
  seed: 42
)";

// A cancelled job with complete checkpoints at steps 20 and 40, and a half-written one at 60.
JobRecord CancelledJob(const TempDir& dir) {
  JobRecord job;
  job.id = "job-000003";
  job.uid = "u1";
  job.state = JobState::kCancelled;
  job.output_dir = dir.path();
  job.resolved_config_yaml = kResolved;
  const std::string checkpoints = CheckpointsDir(job.output_dir, job.id, job.uid);
  for (int step : {20, 40, 60}) EXPECT_TRUE(MakeDirs(CheckpointDir(checkpoints, step)).ok());
  for (int step : {20, 40}) WriteFile(CheckpointDir(checkpoints, step) + "/manifest.json", "{}");
  return job;
}

std::string With(const std::string& from, const std::string& to) {
  return absl::StrReplaceAll(kResolved, {{from, to}});
}

TEST(CoordinatorResumePlanTest, TheSameFileContinuesFromTheNewestCompleteCheckpoint) {
  TempDir dir;
  const JobRecord job = CancelledJob(dir);
  absl::StatusOr<ResumePlan> plan = PlanResume(job, With("\"first\"", "\"second\""));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->step, 40);
  EXPECT_EQ(plan->checkpoint, CheckpointDir(CheckpointsDir(dir.path(), "job-000003", "u1"), 40));
  EXPECT_THAT(plan->statement, HasSubstr("continues job-000003 from step 40"));
  EXPECT_THAT(plan->statement, HasSubstr("same job file"));  // the name is not a change
  JobRecord failed = job;
  failed.state = JobState::kFailed;
  EXPECT_TRUE(PlanResume(failed, kResolved).ok());
}

TEST(CoordinatorResumePlanTest, OtherSettingsTakeEffectAndADataOrderChangeIsSaid) {
  TempDir dir;
  const JobRecord job = CancelledJob(dir);
  absl::StatusOr<ResumePlan> plan = PlanResume(job, With("learning_rate: 0.003", "learning_rate: 0.001"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->statement, HasSubstr("changed from step 41: trainer.learning_rate 0.003 -> 0.001"));
  EXPECT_THAT(plan->statement, Not(HasSubstr("data order")));

  plan = PlanResume(job, With("batch_size: 4", "batch_size: 2"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->statement, HasSubstr("the data order changed (trainer.batch_size 4 -> 2)"));
  EXPECT_THAT(plan->statement, HasSubstr("skips the first 40 steps of the new order"));
}

TEST(CoordinatorResumePlanTest, AnotherBaseModelOrAdapterShapeIsRefusedNamingTheKey) {
  TempDir dir;
  const JobRecord job = CancelledJob(dir);
  for (const auto& [from, to, key] :
       {std::tuple<std::string, std::string, std::string>{"r: 8", "r: 16", "adapter.r 8"},
        {"[q_proj, v_proj]", "[q_proj]", "adapter.target_modules [q_proj, v_proj]"},
        {"/models/tiny", "/models/other", "base_model /models/tiny"}}) {
    const absl::Status refused = PlanResume(job, With(from, to)).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << key;
    EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("trained with ", key))) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("pretrained_adapter_weights")) << refused;
  }
}

TEST(CoordinatorResumePlanTest, OnlyACancelledOrFailedJobWithACheckpointCanBeContinued) {
  TempDir dir;
  JobRecord job = CancelledJob(dir);
  job.state = JobState::kRunning;
  absl::Status refused = PlanResume(job, kResolved).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("job-000003 is RUNNING"));
  job.state = JobState::kSucceeded;
  job.adapter_path = "/out/adapter";
  refused = PlanResume(job, kResolved).status();
  EXPECT_THAT(refused.message(), HasSubstr("pretrained_adapter_weights: /out/adapter"));

  TempDir empty;
  JobRecord none = CancelledJob(empty);
  none.uid = "another";  // its checkpoints are not this job's
  refused = PlanResume(none, kResolved).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("no complete checkpoint"));
}

}  // namespace
}  // namespace qlora::coordinator
