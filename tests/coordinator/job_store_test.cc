// JobStore on a real SQLite file: jobs and events round-trip, keep their order and survive a
// reopen (what a restarted coordinator reads back).
#include "coordinator/store/job_store.h"

#include <sqlite3.h>

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using testing::TempDir;

JobRecord Job(const std::string& id, JobState state) {
  JobRecord j;
  j.id = id;
  j.name = "name of " + id;
  j.state = state;
  j.reason_code = "SUBMITTED";
  j.message = "accepted; 2 workers";
  j.created_unix = 1700000000.25;
  j.started_unix = 1700000001.5;
  j.finished_unix = 0;
  j.job_yaml = "model_type: llm\n# a comment\n";
  j.resolved_config_yaml = "resolved: true\n";
  j.num_workers = 2;
  j.zero_stage = 1;
  j.output_dir = "/out/" + id;
  j.adapter_path = "/out/" + id + "/adapter";
  j.last_sequence = 0;
  return j;
}

// Runs `sql` on the store file at `path` directly (an older or foreign store made by hand),
// expecting it to succeed.
void ExecOnStoreFile(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &error), SQLITE_OK)
      << (error != nullptr ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

JobEvent StateEvent(int64_t seq, JobState state, const std::string& reason) {
  JobEvent e;
  e.sequence = seq;
  e.time_unix = 1700000000 + seq;
  e.state = state;
  e.reason_code = reason;
  e.message = "message " + std::to_string(seq);
  return e;
}

JobEvent ProgressEvent(int64_t seq, int rank, int64_t step, double loss) {
  JobEvent e = StateEvent(seq, JobState::kRunning, "PROGRESS");
  ProgressSnapshot p;
  p.rank = rank;
  p.step = step;
  p.total_steps = 10;
  p.epoch = 1;
  p.loss = loss;
  p.learning_rate = 1e-4;
  p.tokens_per_second = 123.5;
  p.eval_loss = std::nan("");  // not evaluated yet
  p.elapsed_seconds = 7.25;
  p.memory.device_allocated_bytes = 1 << 20;
  p.memory.device_reserved_peak_bytes = 3 << 20;
  p.strategy = {1, 4, 1792, 448, true, false};
  p.checkpointing = {20, 32, int64_t{21} << 30, int64_t{24} << 30, int64_t{22} << 30, 7, 3};
  p.memory.host_rss_bytes = 5 << 20;
  e.progress = p;
  return e;
}

class CoordinatorJobStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<JobStore> Open() {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_.path() + "/jobs.sqlite");
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  TempDir dir_;
};

TEST_F(CoordinatorJobStoreTest, JobsRoundTripInSubmissionOrder) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const JobRecord a = Job("job-000002", JobState::kQueued);
  const JobRecord b = Job("job-000001", JobState::kRunning);
  ASSERT_TRUE(store->PutJob(a).ok());
  ASSERT_TRUE(store->PutJob(b).ok());
  absl::StatusOr<std::vector<JobRecord>> jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  // Order of first insertion, not of ids.
  EXPECT_EQ((*jobs)[0].id, "job-000002");
  EXPECT_EQ((*jobs)[1].id, "job-000001");
  const JobRecord& got = (*jobs)[1];
  EXPECT_EQ(got.name, b.name);
  EXPECT_EQ(got.state, JobState::kRunning);
  EXPECT_EQ(got.reason_code, b.reason_code);
  EXPECT_EQ(got.message, b.message);
  EXPECT_DOUBLE_EQ(got.created_unix, b.created_unix);
  EXPECT_DOUBLE_EQ(got.started_unix, b.started_unix);
  EXPECT_EQ(got.job_yaml, b.job_yaml);
  EXPECT_EQ(got.resolved_config_yaml, b.resolved_config_yaml);
  EXPECT_EQ(got.num_workers, 2);
  EXPECT_EQ(got.zero_stage, 1);
  EXPECT_EQ(got.output_dir, b.output_dir);
  EXPECT_EQ(got.adapter_path, b.adapter_path);
}

// A finished job's merged folder and summary survive a restart (NaN: no evaluation).
TEST_F(CoordinatorJobStoreTest, SummaryAndMergedPathRoundTrip) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  JobRecord a = Job("job-000001", JobState::kSucceeded);
  a.merged_path = "/out/job-000001/merged";
  TrainSummary s;
  s.train_runtime_seconds = 12.5;
  s.train_loss = 1.25;
  s.final_train_loss = 0.75;
  s.steps = 40;
  s.global_step = 80;
  s.samples = 320;
  s.tokens = 20480;
  s.train_samples_per_second = 25.6;
  s.train_steps_per_second = 3.2;
  s.tokens_per_second = 1638.4;
  s.peak_memory_bytes = int64_t{5} << 30;
  a.summary = s;
  ASSERT_TRUE(store->PutJob(a).ok());
  ASSERT_TRUE(store->PutJob(Job("job-000002", JobState::kRunning)).ok());
  store.reset();
  store = Open();
  absl::StatusOr<std::vector<JobRecord>> jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  const JobRecord& got = (*jobs)[0];
  EXPECT_EQ(got.merged_path, a.merged_path);
  ASSERT_TRUE(got.summary.has_value());
  EXPECT_DOUBLE_EQ(got.summary->train_runtime_seconds, 12.5);
  EXPECT_DOUBLE_EQ(got.summary->train_loss, 1.25);
  EXPECT_DOUBLE_EQ(got.summary->final_train_loss, 0.75);
  EXPECT_EQ(got.summary->steps, 40);
  EXPECT_EQ(got.summary->global_step, 80);
  EXPECT_EQ(got.summary->samples, 320);
  EXPECT_EQ(got.summary->tokens, 20480);
  EXPECT_DOUBLE_EQ(got.summary->train_samples_per_second, 25.6);
  EXPECT_DOUBLE_EQ(got.summary->train_steps_per_second, 3.2);
  EXPECT_DOUBLE_EQ(got.summary->tokens_per_second, 1638.4);
  EXPECT_EQ(got.summary->peak_memory_bytes, int64_t{5} << 30);
  EXPECT_TRUE(std::isnan(got.summary->eval_loss));
  EXPECT_TRUE(std::isnan(got.summary->best_eval_loss));
  EXPECT_TRUE((*jobs)[1].merged_path.empty());
  EXPECT_FALSE((*jobs)[1].summary.has_value());
}

TEST_F(CoordinatorJobStoreTest, PutJobUpdatesInPlaceAndKeepsTheOrder) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  JobRecord a = Job("job-000001", JobState::kQueued);
  ASSERT_TRUE(store->PutJob(a).ok());
  ASSERT_TRUE(store->PutJob(Job("job-000002", JobState::kQueued)).ok());
  a.state = JobState::kFailed;
  a.reason_code = "WORKER_EXITED";
  a.finished_unix = 1700000100;
  a.last_sequence = 9;
  ASSERT_TRUE(store->PutJob(a).ok());
  absl::StatusOr<std::vector<JobRecord>> jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id, "job-000001");
  EXPECT_EQ((*jobs)[0].state, JobState::kFailed);
  EXPECT_EQ((*jobs)[0].reason_code, "WORKER_EXITED");
  EXPECT_EQ((*jobs)[0].last_sequence, 9);
  EXPECT_DOUBLE_EQ((*jobs)[0].finished_unix, 1700000100);
}

// A store written before events were kept as protos (the positional events table, here as its
// first version, without the columns later versions added): it opens, its events are moved into
// the current table with every field they had (the later fields at those versions' defaults),
// the old table is gone, and new events are stored and read beside the moved ones.
TEST_F(CoordinatorJobStoreTest, AStoreWithThePositionalEventTableOpensWithItsEventsMoved) {
  const std::string path = dir_.path() + "/jobs.sqlite";
  ASSERT_NO_FATAL_FAILURE(ExecOnStoreFile(path, R"sql(
CREATE TABLE events (
  job_id TEXT, seq INTEGER, time REAL, state INTEGER, reason_code TEXT, message TEXT,
  has_progress INTEGER, rank INTEGER, step INTEGER, total_steps INTEGER, epoch INTEGER,
  loss REAL, lr REAL, tokens_per_second REAL, eval_loss REAL, elapsed REAL,
  dev_alloc INTEGER, dev_peak INTEGER, master INTEGER, optim INTEGER, grads INTEGER,
  comm INTEGER, rss INTEGER, PRIMARY KEY (job_id, seq));
INSERT INTO events (job_id, seq, time, state, reason_code, message, has_progress)
  VALUES ('job-000001', 1, 1700000001.5, 1, 'SUBMITTED', 'accepted; 2 workers', 0);
INSERT INTO events VALUES ('job-000001', 2, 1700000002.25, 3, 'PROGRESS', '', 1, 1, 40, 100, 2,
  1.75, 0.0002, 812.5, NULL, 33.5, 11, 12, 13, 14, 15, 16, 17);
INSERT INTO events (job_id, seq, time, state, reason_code, message, has_progress)
  VALUES ('job-000002', 1, 1700000003, 1, 'SUBMITTED', 'other', 0);
)sql"));

  auto store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<JobEvent>> events = store->LoadEvents("job-000001", 0);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].sequence, 1);
  EXPECT_DOUBLE_EQ((*events)[0].time_unix, 1700000001.5);
  EXPECT_EQ((*events)[0].state, JobState::kQueued);
  EXPECT_EQ((*events)[0].reason_code, "SUBMITTED");
  EXPECT_EQ((*events)[0].message, "accepted; 2 workers");
  EXPECT_FALSE((*events)[0].progress.has_value());
  ASSERT_TRUE((*events)[1].progress.has_value());
  const ProgressSnapshot& p = *(*events)[1].progress;
  EXPECT_EQ((*events)[1].state, JobState::kRunning);
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.step, 40);
  EXPECT_EQ(p.total_steps, 100);
  EXPECT_EQ(p.epoch, 2);
  EXPECT_DOUBLE_EQ(p.loss, 1.75);
  EXPECT_DOUBLE_EQ(p.learning_rate, 0.0002);
  EXPECT_DOUBLE_EQ(p.tokens_per_second, 812.5);
  EXPECT_TRUE(std::isnan(p.eval_loss));
  EXPECT_DOUBLE_EQ(p.elapsed_seconds, 33.5);
  EXPECT_EQ(p.memory.device_allocated_bytes, 11);
  EXPECT_EQ(p.memory.host_rss_bytes, 17);
  EXPECT_EQ(p.memory.device_reserved_peak_bytes, 0);
  EXPECT_EQ(p.strategy.zero_stage, -1);
  EXPECT_EQ(p.checkpointing.checkpointed_layers, -1);
  EXPECT_EQ(p.checkpointing.offloaded_layers, 0);

  JobEvent next = ProgressEvent(3, 0, 41, 1.5);
  ASSERT_TRUE(store->AppendEvent("job-000001", next).ok());
  store.reset();
  store = Open();  // a second open finds the current table and changes nothing
  ASSERT_NE(store, nullptr);
  events = store->LoadEvents("job-000001", 1);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].progress->checkpointing.offloaded_layers, 7);
  absl::StatusOr<std::vector<JobEvent>> other = store->LoadEvents("job-000002", 0);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(other->size(), 1u);
  EXPECT_EQ((*other)[0].message, "other");

  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* columns = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info('events') ORDER BY cid",
                               -1, &columns, nullptr), SQLITE_OK);
  std::vector<std::string> names;
  while (sqlite3_step(columns) == SQLITE_ROW) {
    names.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(columns, 0)));
  }
  sqlite3_finalize(columns);
  sqlite3_close(db);
  EXPECT_THAT(names, ::testing::ElementsAre("job_id", "seq", "event"));
}

// An event whose stored bytes are not a qlora.v1.JobEvent (a damaged or foreign file) fails the
// read with INTERNAL instead of coming back as an empty event.
TEST_F(CoordinatorJobStoreTest, AnEventThatDoesNotParseFailsTheRead) {
  const std::string path = dir_.path() + "/jobs.sqlite";
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->AppendEvent("job-000001", StateEvent(1, JobState::kQueued, "SUBMITTED")).ok());
  }
  ASSERT_NO_FATAL_FAILURE(ExecOnStoreFile(
      path, "INSERT INTO events VALUES ('job-000001', 2, x'ffffffffffffffffff')"));
  auto store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<JobEvent>> events = store->LoadEvents("job-000001", 0);
  ASSERT_FALSE(events.ok());
  EXPECT_EQ(events.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(events.status().message()), ::testing::HasSubstr("qlora.v1.JobEvent"));
}

// A store whose events cannot gain a column (here `events` is a view, as a hand-edited or foreign
// file may have it) does not open: the error names the store and the column, and the file keeps
// what it had. (Before, the column's error was taken for "there already" and every later write
// of the job's events failed.)
TEST_F(CoordinatorJobStoreTest, AStoreThatCannotGainAColumnDoesNotOpenAndSaysWhich) {
  const std::string path = dir_.path() + "/jobs.sqlite";
  ASSERT_NO_FATAL_FAILURE(ExecOnStoreFile(path,
                                          "CREATE TABLE old_events (job_id TEXT, seq INTEGER); "
                                          "INSERT INTO old_events VALUES ('job-000001', 1); "
                                          "CREATE VIEW events AS SELECT * FROM old_events"));

  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInternal);
  const std::string message(store.status().message());
  EXPECT_THAT(message, ::testing::HasSubstr("cannot bring job store " + path + " up to date"));
  EXPECT_THAT(message, ::testing::HasSubstr("adding the column events.dev_reserved"));
  EXPECT_THAT(message, ::testing::HasSubstr("view"));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* count = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM old_events", -1, &count, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(count), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(count, 0), 1);
  sqlite3_finalize(count);
  sqlite3_close(db);
}

TEST_F(CoordinatorJobStoreTest, EventsComeBackInSequenceOrderAfterAGivenSequence) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->PutJob(Job("job-000001", JobState::kRunning)).ok());
  ASSERT_TRUE(store->AppendEvent("job-000001", StateEvent(1, JobState::kQueued, "SUBMITTED")).ok());
  ASSERT_TRUE(store->AppendEvent("job-000001", StateEvent(2, JobState::kStarting, "WORKERS_STARTING")).ok());
  ASSERT_TRUE(store->AppendEvent("job-000001", ProgressEvent(3, 1, 4, 2.5)).ok());
  ASSERT_TRUE(store->AppendEvent("job-000002", StateEvent(1, JobState::kQueued, "OTHER_JOB")).ok());
  // A sequence number is used once per job.
  EXPECT_FALSE(store->AppendEvent("job-000001", StateEvent(3, JobState::kFailed, "DUPLICATE")).ok());

  absl::StatusOr<std::vector<JobEvent>> all = store->LoadEvents("job-000001", 0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].reason_code, "SUBMITTED");
  EXPECT_EQ((*all)[1].reason_code, "WORKERS_STARTING");
  EXPECT_EQ((*all)[1].state, JobState::kStarting);
  EXPECT_EQ((*all)[1].message, "message 2");
  EXPECT_FALSE((*all)[1].progress.has_value());
  ASSERT_TRUE((*all)[2].progress.has_value());
  const ProgressSnapshot& p = *(*all)[2].progress;
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.step, 4);
  EXPECT_DOUBLE_EQ(p.loss, 2.5);
  EXPECT_TRUE(std::isnan(p.eval_loss));
  EXPECT_DOUBLE_EQ(p.tokens_per_second, 123.5);
  EXPECT_EQ(p.memory.device_allocated_bytes, 1 << 20);
  EXPECT_EQ(p.memory.device_reserved_peak_bytes, 3 << 20);
  EXPECT_EQ(p.strategy.zero_stage, 1);
  EXPECT_EQ(p.strategy.world_size, 4);
  EXPECT_EQ(p.strategy.trainable_elements, 1792);
  EXPECT_EQ(p.strategy.partition_elements, 448);
  EXPECT_TRUE(p.strategy.partitioned_optimizer);
  EXPECT_FALSE(p.strategy.partitioned_gradients);
  EXPECT_EQ(p.memory.host_rss_bytes, 5 << 20);
  EXPECT_EQ(p.checkpointing.checkpointed_layers, 20);
  EXPECT_EQ(p.checkpointing.layers, 32);
  EXPECT_EQ(p.checkpointing.planned_peak_bytes, int64_t{21} << 30);
  EXPECT_EQ(p.checkpointing.budget_bytes, int64_t{24} << 30);
  EXPECT_EQ(p.checkpointing.measured_peak_bytes, int64_t{22} << 30);
  EXPECT_EQ(p.checkpointing.offloaded_layers, 7);
  EXPECT_EQ(p.checkpointing.dequantized_layers, 3);

  absl::StatusOr<std::vector<JobEvent>> after = store->LoadEvents("job-000001", 2);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), 1u);
  EXPECT_EQ((*after)[0].sequence, 3);
}

TEST_F(CoordinatorJobStoreTest, ReopenedStoreHasTheJobsEventsAndLatestProgressPerRank) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    JobRecord j = Job("job-000001", JobState::kRunning);
    j.last_sequence = 4;
    ASSERT_TRUE(store->PutJob(j).ok());
    ASSERT_TRUE(store->AppendEvent(j.id, StateEvent(1, JobState::kRunning, "ALL_WORKERS_REGISTERED")).ok());
    ASSERT_TRUE(store->AppendEvent(j.id, ProgressEvent(2, 0, 1, 3.0)).ok());
    ASSERT_TRUE(store->AppendEvent(j.id, ProgressEvent(3, 1, 1, 3.1)).ok());
    ASSERT_TRUE(store->AppendEvent(j.id, ProgressEvent(4, 0, 2, 2.0)).ok());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<JobRecord>> jobs = store->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  const JobRecord& j = (*jobs)[0];
  EXPECT_EQ(j.state, JobState::kRunning);
  EXPECT_EQ(j.last_sequence, 4);
  ASSERT_EQ(j.progress.size(), 2u);
  EXPECT_EQ(j.progress[0].step, 2);  // the latest of rank 0
  EXPECT_DOUBLE_EQ(j.progress[0].loss, 2.0);
  EXPECT_EQ(j.progress[1].step, 1);
  absl::StatusOr<std::vector<JobEvent>> events = store->LoadEvents("job-000001", 0);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 4u);
}

TEST_F(CoordinatorJobStoreTest, OpeningInAMissingFolderIsUnavailable) {
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(dir_.path() + "/no/such/folder/jobs.sqlite");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace qlora::coordinator
