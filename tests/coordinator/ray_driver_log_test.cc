// What the coordinator reads from the Ray launcher's driver log (DriverLogReader) and from Ray's
// REST answers (ParseRayJobInfo, ParseRayClusterCapacity; the samples are the shapes Ray 2.60's
// dashboard returned, trimmed). The whole path against a real Ray cluster is
// tests/service/ray_cluster_test.cc.
#include "coordinator/launch/ray/driver_log.h"

#include "coordinator/launch/ray/ray_job_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(CoordinatorRayDriverLogTest, SplitsRankOutputEndsAndDriverLines) {
  DriverLogReader reader("n0nce");
  const std::string log =
      "Running entrypoint for job qlora-job-000001: python3 launcher.py\n"
      "\x1b[36m(run_rank pid=23355, ip=10.77.0.2)\x1b[0m QLORA-LOG 1 [rank 1] registered\n"
      "\x1b[36m(run_rank pid=23353)\x1b[0m QLORA-LOG 0 step 1 loss 2.5\n"
      "QLORA-EXIT n0nce {\"rank\": 1, \"host\": \"10.77.0.2\", \"pid\": 77, \"code\": 0, \"signal\": 9}\n"
      "QLORA-LOG 0 partial line without its newl";
  DriverLogNews news = reader.Feed(log);
  EXPECT_THAT(news.output, ElementsAre(Pair(1, "[rank 1] registered\n"), Pair(0, "step 1 loss 2.5\n")));
  ASSERT_EQ(news.ends.size(), 1u);
  EXPECT_EQ(news.ends[0].rank, 1);
  EXPECT_EQ(news.ends[0].where, "host 10.77.0.2, pid 77");
  EXPECT_TRUE(news.ends[0].info.signaled);
  EXPECT_EQ(news.ends[0].info.code, 9);
  EXPECT_THAT(news.driver_lines, ElementsAre(HasSubstr("Running entrypoint")));

  // The log grows: only what is new and complete is read, once.
  const std::string grown = log + "ine\nQLORA-EXIT n0nce {\"rank\": -1, \"cause\": \"could not place 2 bundles\"}\n";
  news = reader.Feed(grown);
  EXPECT_THAT(news.output, ElementsAre(Pair(0, "partial line without its newline\n")));
  ASSERT_EQ(news.ends.size(), 1u);
  EXPECT_EQ(news.ends[0].rank, -1);
  EXPECT_EQ(news.ends[0].info.Describe(), "could not place 2 bundles");
  news = reader.Feed(grown);
  EXPECT_TRUE(news.ends.empty());
  EXPECT_TRUE(news.output.empty());
}

TEST(CoordinatorRayDriverLogTest, RankOutputCannotForgeAnEnd) {
  DriverLogReader reader("n0nce");
  // A worker printing an end marker: Ray's prefix comes first, so it is that rank's output.
  DriverLogNews news = reader.Feed(
      "(run_rank pid=1) QLORA-LOG 0 QLORA-EXIT {\"rank\": 1, \"code\": 0}\n"
      "QLORA-EXIT n0nce not json\n"
      "QLORA-EXIT guessed {\"rank\": 0, \"code\": 0}\n"
      "QLORA-EXIT n0nce {\"rank\": 1, \"host\": 7, \"pid\": \"x\", \"signal\": [9], \"cause\": {}}\n"
      "QLORA-LOG x no rank\n");
  // Only the last end line is one (a wrong nonce is not; fields of the wrong type are ignored,
  // never an exception).
  ASSERT_EQ(news.ends.size(), 1u);
  EXPECT_EQ(news.ends[0].rank, 1);
  EXPECT_EQ(news.ends[0].where, "");
  EXPECT_FALSE(news.ends[0].info.signaled);
  EXPECT_EQ(news.ends[0].info.Describe(), "exit status 0");
  EXPECT_THAT(news.output, ElementsAre(Pair(0, "QLORA-EXIT {\"rank\": 1, \"code\": 0}\n")));
  EXPECT_EQ(news.driver_lines.size(), 3u);
}

TEST(CoordinatorRayJobApiTest, ParsesJobInfoListAndCapacity) {
  absl::StatusOr<RayJobInfo> info = ParseRayJobInfo(
      R"({"type": "SUBMISSION", "job_id": "02000000", "submission_id": "qtest1", "status": "FAILED",
          "message": "Job entrypoint command failed with exit code 3", "metadata": {"qlora_job_uid": "abc"}})");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->submission_id, "qtest1");
  EXPECT_TRUE(info->terminal());
  EXPECT_EQ(info->metadata.at("qlora_job_uid"), "abc");
  EXPECT_FALSE(ParseRayJobInfo("[1]").ok());

  absl::StatusOr<std::vector<RayJobInfo>> list =
      ParseRayJobList(R"([{"submission_id": "a", "status": "RUNNING"}, {"submission_id": "b", "status": "STOPPED"}])");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_FALSE((*list)[0].terminal());
  EXPECT_TRUE((*list)[1].terminal());

  absl::StatusOr<LauncherCapacity> capacity = ParseRayClusterCapacity(
      R"({"result": true, "data": {"clusterStatus": {"loadMetricsReport": {"usage":
          {"node:10.77.0.1": [0.0, 1.0], "node:InternalHead": [0.0, 1.0], "CPU": [1.0, 4.0], "GPU": [0.0, 2.0], "memory": [0.0, 3.2e10]}}}}})");
  ASSERT_TRUE(capacity.ok()) << capacity.status();
  EXPECT_EQ(capacity->cpus, 4);
  EXPECT_EQ(capacity->gpus, 2);
  EXPECT_EQ(capacity->hosts, 1);  // node:10.77.0.1 (node:InternalHead is not a host)
  EXPECT_TRUE(capacity->known);
  EXPECT_FALSE(ParseRayClusterCapacity(R"({"data": {}})").ok());
}

TEST(CoordinatorRayJobApiTest, SubmissionCarriesEnvironmentAndMetadata) {
  RaySubmission s;
  s.submission_id = "qlora-job-000001-abcd-1";
  s.entrypoint = "'python3' '/opt/qlora/qlora_ray_launcher.py'";
  s.env_vars = {{"QLORA_RAY_SPEC", "{\"ranks\": []}"}};
  s.metadata = {{"qlora_job_uid", "abcd"}};
  const std::string json = RaySubmissionJson(s);
  EXPECT_THAT(json, HasSubstr(R"("runtime_env":{"env_vars":{"QLORA_RAY_SPEC":"{\"ranks\": []}"}})"));
  EXPECT_THAT(json, HasSubstr(R"("metadata":{"qlora_job_uid":"abcd"})"));
  EXPECT_THAT(json, HasSubstr(R"("submission_id":"qlora-job-000001-abcd-1")"));
}

}  // namespace
}  // namespace qlora::coordinator
