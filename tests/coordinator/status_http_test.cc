// The HTTP port's pure parts (coordinator/http): the metrics text from a snapshot, the status
// page's JSON (escaping, thinning), the bounded log tail, and the job store's read-only
// connection. End to end with a real coordinator: tests/service/status_page_test.cc.
#include <sys/stat.h>

#include <cmath>
#include <limits>

#include "coordinator/http/log_tail.h"
#include "coordinator/http/metrics.h"
#include "coordinator/http/status_api.h"
#include "coordinator/store/job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;

JobRecord Running(const std::string& id, int ranks) {
  JobRecord job;
  job.id = id;
  job.name = "n";
  job.state = JobState::kRunning;
  for (int r = 0; r < ranks; ++r) {
    ProgressSnapshot p;
    p.rank = r;
    p.step = 7;
    p.total_steps = 10;
    p.loss = 1.5;
    p.learning_rate = 0.001;
    p.tokens_per_second = 100;
    p.eval_loss = std::numeric_limits<double>::quiet_NaN();
    p.memory.host_rss_bytes = 1000 + r;
    job.progress.push_back(p);
  }
  return job;
}

TEST(StatusHttpTest, MetricsRenderTheSnapshotAndTheCounters) {
  CoordinatorMetrics metrics({"/qlora.v1.JobService/GetJob"});
  metrics.ObserveRpc("/qlora.v1.JobService/GetJob", "OK", 0.002);
  metrics.ObserveRpc("/evil/\"injected\"", "UNIMPLEMENTED", 0.001);
  WorkerExit completed;
  completed.completed = true;
  metrics.CountWorkerExit(completed);
  WorkerExit lost;
  lost.info.cause = "the node died";
  metrics.CountWorkerExit(lost);

  ManagerSnapshot now;
  now.jobs.push_back(Running("job-000001", 2));
  JobRecord queued;
  queued.id = "job-000002";
  queued.state = JobState::kQueued;
  now.jobs.push_back(queued);
  JobRecord done = Running("job-000003", 1);
  done.state = JobState::kSucceeded;
  now.jobs.push_back(done);
  now.slots_total = 4;
  now.slots_busy = 2;
  now.gpu = true;
  const std::string text = metrics.Render(now);
  EXPECT_THAT(text, HasSubstr("qlora_jobs{state=\"running\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("qlora_jobs{state=\"queued\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("qlora_jobs{state=\"failed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("qlora_queue_length 1\n"));
  EXPECT_THAT(text, HasSubstr("qlora_worker_slots{kind=\"gpu\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("qlora_worker_slots_busy{kind=\"gpu\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("qlora_job_step{job=\"job-000001\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("qlora_job_tokens_per_second{job=\"job-000001\"} 200\n"));
  EXPECT_THAT(text, HasSubstr("qlora_job_host_rss_bytes{job=\"job-000001\",rank=\"1\"} 1001\n"));
  EXPECT_THAT(text, Not(HasSubstr("job-000003"))) << "ended jobs have no per-job series";
  EXPECT_THAT(text, Not(HasSubstr("qlora_job_eval_loss{"))) << "absent until evaluated";
  EXPECT_THAT(text, HasSubstr("qlora_worker_exits_total{cause=\"completed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("qlora_worker_exits_total{cause=\"lost\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("qlora_worker_exits_total{cause=\"signal\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("qlora_rpc_duration_seconds_count{code=\"OK\",method=\"/qlora.v1.JobService/GetJob\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("code=\"UNIMPLEMENTED\",method=\"other\""));
  EXPECT_THAT(text, Not(HasSubstr("evil")));
}

TEST(StatusHttpTest, ExitCauses) {
  WorkerExit e;
  EXPECT_STREQ(ExitCause(e), "exit_status");  // 0 without having reported success
  e.completed = true;
  EXPECT_STREQ(ExitCause(e), "completed");
  e.info.code = 3;
  EXPECT_STREQ(ExitCause(e), "exit_status");
  e.info.signaled = true;
  e.info.code = 9;
  EXPECT_STREQ(ExitCause(e), "signal");
  e.info.cause = "lost node";
  EXPECT_STREQ(ExitCause(e), "lost");
}

TEST(StatusHttpTest, JsonEscapesJobStringsAndThinsLongCurves) {
  JobRecord job = Running("job-000001", 1);
  job.name = "<script>alert(\"x\")</script>\xff";
  job.message = "line\nbreak";
  const std::string list = JobListJson({job});
  EXPECT_THAT(list, HasSubstr("\"name\":\"<script>alert(\\\"x\\\")</script>\xEF\xBF\xBD\"")) << "quoted; bad UTF-8 replaced";
  EXPECT_THAT(list, HasSubstr(R"("eval_loss":null)"));
  EXPECT_THAT(list, HasSubstr(R"("state":"running")"));

  std::vector<JobEvent> events;
  for (int i = 1; i <= 3 * kMaxCurvePoints; ++i) {
    JobEvent e;
    e.sequence = i;
    e.progress = job.progress[0];
    e.progress->step = i;
    e.progress->rank = i % 2 == 0 ? 0 : 1;  // rank 1's points are left out
    events.push_back(e);
  }
  const std::string detail = JobDetailJson(job, events, 0, 0, "log \x01 line\n");
  EXPECT_THAT(detail, HasSubstr(absl::StrCat("\"last_sequence\":", 3 * kMaxCurvePoints)));
  EXPECT_THAT(detail, HasSubstr(absl::StrCat("\"step\":", 3 * kMaxCurvePoints, ",")));
  EXPECT_THAT(detail, HasSubstr(R"("log":"log \u0001 line\n")"));
  EXPECT_THAT(detail, HasSubstr(R"("message":"line\nbreak")"));
  EXPECT_THAT(detail, HasSubstr(R"("checkpointing":null)"));  // not reported yet
  job.progress[0].checkpointing = {13, 32, 22 * (int64_t{1} << 30), 24 * (int64_t{1} << 30), 0, 9, 4};
  EXPECT_THAT(JobDetailJson(job, events, 0, 0, ""),
              HasSubstr(R"("checkpointing":{"budget_bytes":25769803776,"checkpointed_layers":13,)"
                        R"("dequantized_layers":4,)"
                        R"("layers":32,"measured_peak_bytes":0,"offloaded_layers":9,)"
                        R"("planned_peak_bytes":23622320128})"));
  size_t points = 0;
  for (size_t at = 0; (at = detail.find("\"seq\":", at)) != std::string::npos; ++at) ++points;
  EXPECT_LE(points, static_cast<size_t>(kMaxCurvePoints) + 1);
  EXPECT_GE(points, static_cast<size_t>(kMaxCurvePoints) / 2);
}

// The status page shows the latest evaluation samples: the last metrics.jsonl line that has them,
// whatever steps follow; a torn or absent line shows none.
TEST(StatusHttpTest, TheLatestSamplesComeFromTheEndOfMetricsJsonl) {
  const std::string tail =
      "{\"step\":2,\"samples\":[{\"prompt\":\"old\",\"output\":\"a\"}]}\n"
      "{\"step\":3,\"loss\":1.5}\n"
      "{\"step\":4,\"samples\":[{\"prompt\":\"<b>p</b>\",\"output\":\"new\"}]}\n"
      "{\"step\":5,\"loss\":1.2}\n";
  EXPECT_EQ(LatestSamplesJson(tail), R"({"samples":[{"output":"new","prompt":"<b>p</b>"}],"step":4})");
  EXPECT_EQ(LatestSamplesJson("{\"step\":3,\"loss\":1.5}\n{\"step\":4,\"samples\":[{\"pro"), "null");
  // The job's user can write metrics.jsonl: a step of the wrong type reads as 0, never throws.
  EXPECT_EQ(LatestSamplesJson("{\"step\":\"x\",\"samples\":[]}\n"), R"({"samples":[],"step":0})");
  EXPECT_EQ(LatestSamplesJson(""), "null");
  JobRecord job = Running("job-000001", 1);
  EXPECT_THAT(JobDetailJson(job, {}, 0, 0, "", tail), HasSubstr(R"("samples":{"samples":[{"output":"new")"));
  EXPECT_THAT(JobDetailJson(job, {}, 0, 0, ""), HasSubstr(R"("samples":null)"));
}

TEST(StatusHttpTest, LogTailIsBoundedStartsAtALineAndRefusesFifos) {
  TempDir dir;
  const std::string log = dir.path() + "/rank-0.log";
  EXPECT_EQ(*ReadLogTail(log, 100), "") << "no log yet";
  std::string text;
  for (int i = 0; i < 100; ++i) text += absl::StrCat("line ", i, "\n");
  testing::WriteFile(log, text);
  const std::string tail = *ReadLogTail(log, 30);
  EXPECT_LE(tail.size(), 30u);
  EXPECT_EQ(tail.substr(0, 5), "line ");
  EXPECT_EQ(tail.substr(tail.size() - 8), "line 99\n");
  EXPECT_EQ(*ReadLogTail(log, 1 << 20), text);
  const std::string fifo = dir.path() + "/fifo.log";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ReadLogTail(fifo, 100).status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string link = dir.path() + "/link.log";
  ASSERT_EQ(symlink(log.c_str(), link.c_str()), 0);
  EXPECT_EQ(ReadLogTail(link, 100).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StatusHttpTest, ReadOnlyStoreReadsWhatTheWriterWrote) {
  TempDir dir;
  const std::string path = dir.path() + "/jobs.sqlite";
  JobStoreOptions read_only;
  read_only.read_only = true;
  EXPECT_FALSE(JobStore::Open(path, read_only).ok()) << "never creates a store";
  std::unique_ptr<JobStore> writer = *JobStore::Open(path);
  JobRecord job = Running("job-000001", 1);
  JobEvent e;
  e.sequence = 1;
  e.progress = job.progress[0];
  ASSERT_TRUE(writer->Record(job, e).ok());
  std::unique_ptr<JobStore> reader = *JobStore::Open(path, read_only);
  absl::StatusOr<std::vector<JobEvent>> events = reader->LoadEvents("job-000001", 0);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].progress->step, 7);
  EXPECT_FALSE(reader->PutJob(job).ok()) << "read-only";
}

}  // namespace
}  // namespace qlora::coordinator
