// SQLite persistence of jobs and their events (see job_store.h).
#include "coordinator/store/job_store.h"

#include <sqlite3.h>

#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "coordinator/store/job_event_proto.h"
#include "coordinator/store/legacy_event_table.h"
#include "coordinator/store/sqlite_statement.h"

namespace qlora::coordinator {
namespace {

using store_internal::Statement;

constexpr const char* kSchema = R"sql(
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, name TEXT, state INTEGER, reason_code TEXT, message TEXT,
  created REAL, started REAL, finished REAL, job_yaml TEXT, resolved_yaml TEXT,
  num_workers INTEGER, zero_stage INTEGER, output_dir TEXT, adapter_path TEXT,
  last_sequence INTEGER, ord INTEGER, owner TEXT DEFAULT '', uid TEXT DEFAULT '',
  restarts INTEGER DEFAULT 0, restart_causes TEXT DEFAULT '', merged_path TEXT DEFAULT '',
  has_summary INTEGER DEFAULT 0, sum_runtime REAL, sum_loss REAL, sum_final_loss REAL,
  sum_steps INTEGER DEFAULT 0, sum_global_step INTEGER DEFAULT 0, sum_samples INTEGER DEFAULT 0,
  sum_tokens INTEGER DEFAULT 0, sum_samples_per_s REAL, sum_steps_per_s REAL,
  sum_tokens_per_s REAL, sum_peak_memory INTEGER DEFAULT 0, sum_eval_loss REAL,
  sum_best_eval_loss REAL);
)sql";

// Each event is its qlora.v1.JobEvent message, keyed by what is looked up: the job and the
// sequence number.
constexpr const char* kCreateEvents = R"sql(
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, event BLOB NOT NULL, PRIMARY KEY (job_id, seq));
)sql";

// What outlives the jobs' rows: the next job number once jobs were forgotten (retention).
constexpr const char* kCreateMeta = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
)sql";

// A job's outputs beyond the adapter: the merged folder and the TrainSummary (jobs.sum_*).
constexpr const char* kOutputColumns[] = {
    "merged_path TEXT DEFAULT ''", "has_summary INTEGER DEFAULT 0", "sum_runtime REAL", "sum_loss REAL",
    "sum_final_loss REAL", "sum_steps INTEGER DEFAULT 0", "sum_global_step INTEGER DEFAULT 0",
    "sum_samples INTEGER DEFAULT 0", "sum_tokens INTEGER DEFAULT 0", "sum_samples_per_s REAL",
    "sum_steps_per_s REAL", "sum_tokens_per_s REAL", "sum_peak_memory INTEGER DEFAULT 0",
    "sum_eval_loss REAL", "sum_best_eval_loss REAL"};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path,
                                                          const JobStoreOptions& options) {
  sqlite3* db = nullptr;
  const int flags = options.read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open job store ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<JobStore> store(new JobStore(db));
  if (options.read_only) return store;
  QLORA_RETURN_IF_ERROR(store->Exec(kSchema));
  // Stores made before a column or the current events table existed are brought up to date;
  // failing that, the store does not open (a store missing a column would fail every later
  // write of it).
  std::vector<const char*> job_columns = {"owner TEXT DEFAULT ''", "uid TEXT DEFAULT ''",
                                          "restarts INTEGER DEFAULT 0",
                                          "restart_causes TEXT DEFAULT ''"};
  job_columns.insert(job_columns.end(), std::begin(kOutputColumns), std::end(kOutputColumns));
  absl::Status migrated = store_internal::AddMissingColumns(db, "jobs", job_columns);
  if (migrated.ok()) {
    absl::StatusOr<bool> legacy = store_internal::HasLegacyEventTable(db);
    migrated = !legacy.ok() ? legacy.status()
               : *legacy    ? store_internal::MigrateLegacyEventTable(
                                  db, kCreateEvents,
                                  [s = store.get()](const std::string& id, const JobEvent& e) {
                                    return s->AppendEvent(id, e);
                                  })
                            : store->Exec(kCreateEvents);
  }
  if (migrated.ok()) migrated = store->Exec(kCreateMeta);
  if (!migrated.ok()) {
    return absl::Status(migrated.code(), absl::StrCat("cannot bring job store ", path,
                                                      " up to date: ", migrated.message()));
  }
  if (options.max_pages > 0) {
    QLORA_RETURN_IF_ERROR(
        store->Exec(absl::StrCat("PRAGMA max_page_count = ", options.max_pages).c_str()));
  }
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const char* sql) { return store_internal::Exec(db_, sql); }

absl::Status JobStore::Record(const JobRecord& job, const JobEvent& event) {
  QLORA_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status written = AppendEvent(job.id, event);
  if (written.ok()) written = PutJob(job);
  if (written.ok()) written = Exec("COMMIT");
  // After SQLITE_FULL SQLite may have rolled back already; then this only reports that.
  if (!written.ok()) (void)Exec("ROLLBACK");
  return written;
}

absl::Status JobStore::PutJob(const JobRecord& j) {
  Statement s(db_,
              "INSERT INTO jobs (id, name, state, reason_code, message, created, started, finished, "
              "job_yaml, resolved_yaml, num_workers, zero_stage, output_dir, adapter_path, "
              "last_sequence, owner, uid, restarts, restart_causes, ord) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,"
              "?11,?12,?13,?14,?15,?16,?17,?18,?19,"
              "(SELECT COALESCE(MAX(ord), 0) + 1 FROM jobs)) ON CONFLICT(id) DO UPDATE SET "
              "name=?2, state=?3, reason_code=?4, message=?5, created=?6, started=?7, finished=?8, "
              "job_yaml=CASE WHEN ?9 = '' THEN job_yaml ELSE ?9 END, "
              "resolved_yaml=CASE WHEN ?10 = '' THEN resolved_yaml ELSE ?10 END, "
              "num_workers=?11, zero_stage=?12, output_dir=?13, "
              "adapter_path=?14, last_sequence=?15, owner=?16, uid=?17, restarts=?18, restart_causes=?19");
  QLORA_RETURN_IF_ERROR(s.status());
  s.Bind(1, j.id).Bind(2, j.name).Bind(3, static_cast<int>(j.state)).Bind(4, j.reason_code)
      .Bind(5, j.message).Bind(6, j.created_unix).Bind(7, j.started_unix).Bind(8, j.finished_unix)
      .Bind(9, j.job_yaml).Bind(10, j.resolved_config_yaml).Bind(11, j.num_workers)
      .Bind(12, j.zero_stage).Bind(13, j.output_dir).Bind(14, j.adapter_path)
      .Bind(15, j.last_sequence).Bind(16, j.owner).Bind(17, j.uid)
      .Bind(18, j.restarts).Bind(19, absl::StrJoin(j.restart_causes, "\n"));
  QLORA_RETURN_IF_ERROR(s.Step().status());
  return j.summary || !j.merged_path.empty() ? PutOutputs(j) : absl::OkStatus();
}

absl::Status JobStore::PutOutputs(const JobRecord& j) {
  Statement s(db_,
              "UPDATE jobs SET merged_path=?2, has_summary=?3, sum_runtime=?4, sum_loss=?5, "
              "sum_final_loss=?6, sum_steps=?7, sum_global_step=?8, sum_samples=?9, sum_tokens=?10, "
              "sum_samples_per_s=?11, sum_steps_per_s=?12, sum_tokens_per_s=?13, sum_peak_memory=?14, "
              "sum_eval_loss=?15, sum_best_eval_loss=?16 WHERE id=?1");
  QLORA_RETURN_IF_ERROR(s.status());
  const TrainSummary m = j.summary.value_or(TrainSummary{});
  s.Bind(1, j.id).Bind(2, j.merged_path).Bind(3, j.summary ? 1 : 0).Bind(4, m.train_runtime_seconds)
      .Bind(5, m.train_loss).Bind(6, m.final_train_loss).Bind(7, m.steps).Bind(8, m.global_step)
      .Bind(9, m.samples).Bind(10, m.tokens).Bind(11, m.train_samples_per_second)
      .Bind(12, m.train_steps_per_second).Bind(13, m.tokens_per_second).Bind(14, m.peak_memory_bytes)
      .Bind(15, m.eval_loss).Bind(16, m.best_eval_loss);
  return s.Step().status();
}

absl::Status JobStore::AppendEvent(const std::string& job_id, const JobEvent& e) {
  Statement s(db_, "INSERT INTO events (job_id, seq, event) VALUES (?1, ?2, ?3)");
  QLORA_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id).Bind(2, e.sequence).BindBlob(3, EncodeJobEvent(e));
  return s.Step().status();
}

absl::Status JobStore::ForgetJob(const std::string& job_id, int64_t next_job_number) {
  QLORA_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status written;
  for (const char* sql : {"DELETE FROM events WHERE job_id = ?1", "DELETE FROM jobs WHERE id = ?1"}) {
    Statement s(db_, sql);
    written = s.status();
    if (written.ok()) written = s.Bind(1, job_id).Step().status();
    if (!written.ok()) break;
  }
  if (written.ok()) {
    Statement s(db_, "INSERT INTO meta (key, value) VALUES ('next_job_number', ?1) "
                     "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)");
    written = s.status();
    if (written.ok()) written = s.Bind(1, next_job_number).Step().status();
  }
  if (written.ok()) written = Exec("COMMIT");
  if (!written.ok()) (void)Exec("ROLLBACK");
  return written;
}

absl::Status JobStore::LoadJobFiles(const std::string& job_id, std::string* job_yaml,
                                   std::string* resolved_yaml) {
  Statement s(db_, "SELECT job_yaml, resolved_yaml FROM jobs WHERE id = ?1");
  QLORA_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id);
  QLORA_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("job ", job_id, " is not in the store"));
  *job_yaml = s.Text(0);
  *resolved_yaml = s.Text(1);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JobStore::NextJobNumber() {
  Statement s(db_, "SELECT value FROM meta WHERE key = 'next_job_number'");
  QLORA_RETURN_IF_ERROR(s.status());
  QLORA_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

absl::StatusOr<std::vector<JobEvent>> JobStore::LoadEvents(const std::string& job_id,
                                                           int64_t after_sequence) {
  Statement s(db_, "SELECT event FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq");
  QLORA_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id).Bind(2, after_sequence);
  std::vector<JobEvent> events;
  while (true) {
    QLORA_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    QLORA_ASSIGN_OR_RETURN(JobEvent event, DecodeJobEvent(s.Blob(0)));
    events.push_back(std::move(event));
  }
  return events;
}

absl::StatusOr<std::vector<JobRecord>> JobStore::LoadJobs() {
  Statement s(db_,
              "SELECT id, name, state, reason_code, message, created, started, finished, job_yaml, "
              "resolved_yaml, num_workers, zero_stage, output_dir, adapter_path, last_sequence, owner, uid, "
              "restarts, restart_causes, merged_path, has_summary, sum_runtime, sum_loss, sum_final_loss, "
              "sum_steps, sum_global_step, sum_samples, sum_tokens, sum_samples_per_s, sum_steps_per_s, "
              "sum_tokens_per_s, sum_peak_memory, sum_eval_loss, sum_best_eval_loss FROM jobs ORDER BY ord");
  QLORA_RETURN_IF_ERROR(s.status());
  std::vector<JobRecord> jobs;
  while (true) {
    QLORA_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    JobRecord j;
    j.id = s.Text(0);
    j.name = s.Text(1);
    j.state = static_cast<JobState>(s.Int(2));
    j.reason_code = s.Text(3);
    j.message = s.Text(4);
    j.created_unix = s.Real(5);
    j.started_unix = s.Real(6);
    j.finished_unix = s.Real(7);
    j.job_yaml = s.Text(8);
    j.resolved_config_yaml = s.Text(9);
    j.num_workers = static_cast<int>(s.Int(10));
    j.zero_stage = static_cast<int>(s.Int(11));
    j.output_dir = s.Text(12);
    j.adapter_path = s.Text(13);
    j.last_sequence = s.Int(14);
    j.owner = s.Text(15);
    j.uid = s.Text(16);
    j.restarts = static_cast<int>(s.Int(17));
    j.restart_causes = absl::StrSplit(s.Text(18), '\n', absl::SkipEmpty());
    j.merged_path = s.Text(19);
    if (s.Int(20) != 0) {
      TrainSummary m;
      m.train_runtime_seconds = s.Real(21);
      m.train_loss = s.Real(22);
      m.final_train_loss = s.Real(23);
      m.steps = s.Int(24);
      m.global_step = s.Int(25);
      m.samples = s.Int(26);
      m.tokens = s.Int(27);
      m.train_samples_per_second = s.Real(28);
      m.train_steps_per_second = s.Real(29);
      m.tokens_per_second = s.Real(30);
      m.peak_memory_bytes = s.Int(31);
      m.eval_loss = s.Real(32);
      m.best_eval_loss = s.Real(33);
      j.summary = m;
    }
    jobs.push_back(std::move(j));
  }
  for (JobRecord& j : jobs) {
    QLORA_ASSIGN_OR_RETURN(std::vector<JobEvent> events, LoadEvents(j.id, 0));
    for (const JobEvent& e : events) {
      if (!e.progress) continue;
      const int rank = e.progress->rank;
      if (rank < 0) continue;
      if (static_cast<int>(j.progress.size()) <= rank) j.progress.resize(rank + 1);
      j.progress[rank] = *e.progress;
    }
  }
  return jobs;
}

}  // namespace qlora::coordinator
