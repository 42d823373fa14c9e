// SQLite persistence of jobs and their events (see job_store.h).
#include "coordinator/job_store.h"

#include <sqlite3.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace qlora::coordinator {
namespace {

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
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT, seq INTEGER, time REAL, state INTEGER, reason_code TEXT, message TEXT,
  has_progress INTEGER, rank INTEGER, step INTEGER, total_steps INTEGER, epoch INTEGER,
  loss REAL, lr REAL, tokens_per_second REAL, eval_loss REAL, elapsed REAL,
  dev_alloc INTEGER, dev_peak INTEGER, master INTEGER, optim INTEGER, grads INTEGER,
  comm INTEGER, rss INTEGER, dev_reserved INTEGER DEFAULT 0, strategy_stage INTEGER DEFAULT -1,
  strategy_world INTEGER DEFAULT 0, strategy_trainable INTEGER DEFAULT 0,
  strategy_partition INTEGER DEFAULT 0, strategy_flags INTEGER DEFAULT 0,
  epoch_trained INTEGER DEFAULT 0, epoch_left_over INTEGER DEFAULT 0,
  epoch_malformed INTEGER DEFAULT 0, epoch_without_target INTEGER DEFAULT 0,
  total_trained INTEGER DEFAULT 0, total_left_over INTEGER DEFAULT 0,
  total_malformed INTEGER DEFAULT 0, total_without_target INTEGER DEFAULT 0,
  ckpt_layers INTEGER DEFAULT -1, ckpt_total INTEGER DEFAULT 0, ckpt_planned INTEGER DEFAULT 0,
  ckpt_budget INTEGER DEFAULT 0, ckpt_measured INTEGER DEFAULT 0,
  ckpt_offloaded INTEGER DEFAULT 0, ckpt_dequantized INTEGER DEFAULT 0,
  PRIMARY KEY (job_id, seq));
)sql";

// The name of SQLite's primary result code, for messages an operator can search for.
const char* SqliteCodeName(int rc) {
  switch (rc & 0xff) {
    case SQLITE_FULL: return "SQLITE_FULL";
    case SQLITE_IOERR: return "SQLITE_IOERR";
    case SQLITE_BUSY: return "SQLITE_BUSY";
    case SQLITE_LOCKED: return "SQLITE_LOCKED";
    case SQLITE_READONLY: return "SQLITE_READONLY";
    case SQLITE_CANTOPEN: return "SQLITE_CANTOPEN";
    case SQLITE_NOMEM: return "SQLITE_NOMEM";
    case SQLITE_CORRUPT: return "SQLITE_CORRUPT";
    case SQLITE_CONSTRAINT: return "SQLITE_CONSTRAINT";
    default: return "SQLITE_ERROR";
  }
}

// "<what>: <SQLite's message> (SQLITE_FULL, ENOSPC: No space left on device)". UNAVAILABLE for
// conditions of the disk or the file that an operator can fix; INTERNAL for the rest.
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  // Only these come from the OS; otherwise the errno may be left from an earlier failure.
  const int primary = rc & 0xff;
  const bool from_os = primary == SQLITE_FULL || primary == SQLITE_IOERR || primary == SQLITE_CANTOPEN;
  const int os_errno = from_os ? sqlite3_system_errno(db) : 0;
  const std::string os = os_errno == 0 ? "" : absl::StrCat(", ", strerrorname_np(os_errno), ": ",
                                                           strerror(os_errno));
  const std::string message =
      absl::StrCat(what, ": ", sqlite3_errmsg(db), " (", SqliteCodeName(rc), os, ")");
  switch (primary) {
    case SQLITE_FULL: case SQLITE_IOERR: case SQLITE_BUSY: case SQLITE_LOCKED:
    case SQLITE_READONLY: case SQLITE_CANTOPEN: case SQLITE_NOMEM:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// RAII prepared statement with 1-based binding helpers.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  absl::Status status() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : SqliteError(db_, rc_, "sqlite prepare");
  }
  Statement& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); return *this; }
  Statement& Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); return *this; }
  Statement& Bind(int i, int v) { sqlite3_bind_int64(stmt_, i, v); return *this; }
  // SQLITE_ROW -> true, SQLITE_DONE -> false.
  absl::StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, "sqlite step");
  }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : "";
  }
  // SQLite stores a NaN as NULL: read it back as NaN (a diverged loss, no evaluation yet).
  double Real(int col) const {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL ? std::nan("") : sqlite3_column_double(stmt_, col);
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

JobEvent ReadEvent(const Statement& s) {
  JobEvent e;
  e.sequence = s.Int(1);
  e.time_unix = s.Real(2);
  e.state = static_cast<JobState>(s.Int(3));
  e.reason_code = s.Text(4);
  e.message = s.Text(5);
  if (s.Int(6) != 0) {
    ProgressSnapshot p;
    p.rank = static_cast<int>(s.Int(7));
    p.step = s.Int(8);
    p.total_steps = s.Int(9);
    p.epoch = static_cast<int>(s.Int(10));
    p.loss = s.Real(11);
    p.learning_rate = s.Real(12);
    p.tokens_per_second = s.Real(13);
    p.eval_loss = s.Real(14);
    p.elapsed_seconds = s.Real(15);
    p.memory = {s.Int(16), s.Int(17), s.Int(18), s.Int(19), s.Int(20), s.Int(21), s.Int(22), s.Int(23)};
    p.strategy.zero_stage = static_cast<int>(s.Int(24));
    p.strategy.world_size = static_cast<int>(s.Int(25));
    p.strategy.trainable_elements = s.Int(26);
    p.strategy.partition_elements = s.Int(27);
    p.strategy.partitioned_optimizer = (s.Int(28) & 1) != 0;
    p.strategy.partitioned_gradients = (s.Int(28) & 2) != 0;
    p.epoch_records = {s.Int(29), s.Int(30), s.Int(31), s.Int(32)};
    p.total_records = {s.Int(33), s.Int(34), s.Int(35), s.Int(36)};
    p.checkpointing = {s.Int(37), s.Int(38), s.Int(39), s.Int(40), s.Int(41), s.Int(42), s.Int(43)};
    e.progress = p;
  }
  return e;
}

// A job's outputs beyond the adapter: the merged folder and the TrainSummary (jobs.sum_*).
constexpr const char* kOutputColumns[] = {
    "merged_path TEXT DEFAULT ''", "has_summary INTEGER DEFAULT 0", "sum_runtime REAL", "sum_loss REAL",
    "sum_final_loss REAL", "sum_steps INTEGER DEFAULT 0", "sum_global_step INTEGER DEFAULT 0",
    "sum_samples INTEGER DEFAULT 0", "sum_tokens INTEGER DEFAULT 0", "sum_samples_per_s REAL",
    "sum_steps_per_s REAL", "sum_tokens_per_s REAL", "sum_peak_memory INTEGER DEFAULT 0",
    "sum_eval_loss REAL", "sum_best_eval_loss REAL"};

constexpr const char* kEventColumns =
    "job_id, seq, time, state, reason_code, message, has_progress, rank, step, total_steps, "
    "epoch, loss, lr, tokens_per_second, eval_loss, elapsed, dev_alloc, dev_peak, master, "
    "optim, grads, comm, rss, dev_reserved, strategy_stage, strategy_world, strategy_trainable, "
    "strategy_partition, strategy_flags, epoch_trained, epoch_left_over, epoch_malformed, "
    "epoch_without_target, total_trained, total_left_over, total_malformed, total_without_target, "
    "ckpt_layers, ckpt_total, ckpt_planned, ckpt_budget, ckpt_measured, ckpt_offloaded, "
    "ckpt_dequantized";

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
  // Stores made before a column existed gain it; failing that, the store does not open (a store
  // missing a column would fail every later write of it).
  absl::Status migrated = store->AddMissingColumns("events", {"dev_reserved INTEGER DEFAULT 0", "strategy_stage INTEGER DEFAULT -1",
                             "strategy_world INTEGER DEFAULT 0", "strategy_trainable INTEGER DEFAULT 0",
                             "strategy_partition INTEGER DEFAULT 0", "strategy_flags INTEGER DEFAULT 0",
                             "epoch_trained INTEGER DEFAULT 0", "epoch_left_over INTEGER DEFAULT 0",
                             "epoch_malformed INTEGER DEFAULT 0", "epoch_without_target INTEGER DEFAULT 0",
                             "total_trained INTEGER DEFAULT 0", "total_left_over INTEGER DEFAULT 0",
                             "total_malformed INTEGER DEFAULT 0", "total_without_target INTEGER DEFAULT 0",
                             "ckpt_layers INTEGER DEFAULT -1", "ckpt_total INTEGER DEFAULT 0",
                             "ckpt_planned INTEGER DEFAULT 0", "ckpt_budget INTEGER DEFAULT 0",
                             "ckpt_measured INTEGER DEFAULT 0", "ckpt_offloaded INTEGER DEFAULT 0",
                             "ckpt_dequantized INTEGER DEFAULT 0"});
  if (migrated.ok()) {
    std::vector<const char*> job_columns = {"owner TEXT DEFAULT ''", "uid TEXT DEFAULT ''",
                                            "restarts INTEGER DEFAULT 0",
                                            "restart_causes TEXT DEFAULT ''"};
    job_columns.insert(job_columns.end(), std::begin(kOutputColumns), std::end(kOutputColumns));
    migrated = store->AddMissingColumns("jobs", job_columns);
  }
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

absl::Status JobStore::AddMissingColumns(const char* table,
                                         const std::vector<const char*>& columns) {
  std::set<std::string> present;
  Statement info(db_, absl::StrCat("PRAGMA table_info(", table, ")").c_str());
  QLORA_RETURN_IF_ERROR(info.status());
  for (;;) {
    QLORA_ASSIGN_OR_RETURN(const bool row, info.Step());
    if (!row) break;
    present.insert(info.Text(1));  // the column's name
  }
  for (const char* column : columns) {
    const absl::string_view definition(column);
    const std::string name(definition.substr(0, definition.find(' ')));
    if (present.count(name) > 0) continue;
    const absl::Status added =
        Exec(absl::StrCat("ALTER TABLE ", table, " ADD COLUMN ", column).c_str());
    if (!added.ok()) {
      return absl::Status(added.code(), absl::StrCat("adding the column ", table, ".", name,
                                                     ": ", added.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status JobStore::Exec(const char* sql) {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? absl::OkStatus() : SqliteError(db_, rc, "sqlite");
}

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
              "job_yaml=?9, resolved_yaml=?10, num_workers=?11, zero_stage=?12, output_dir=?13, "
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
  Statement s(db_, absl::StrCat("INSERT INTO events (", kEventColumns,
                                ") VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,"
                                "?16,?17,?18,?19,?20,?21,?22,?23,?24,?25,?26,?27,?28,?29,?30,?31,"
                                "?32,?33,?34,?35,?36,?37,?38,?39,?40,?41,?42,?43,?44)").c_str());
  QLORA_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id).Bind(2, e.sequence).Bind(3, e.time_unix).Bind(4, static_cast<int>(e.state))
      .Bind(5, e.reason_code).Bind(6, e.message).Bind(7, e.progress ? 1 : 0);
  if (e.progress) {
    const ProgressSnapshot& p = *e.progress;
    s.Bind(8, p.rank).Bind(9, p.step).Bind(10, p.total_steps).Bind(11, p.epoch).Bind(12, p.loss)
        .Bind(13, p.learning_rate).Bind(14, p.tokens_per_second).Bind(15, p.eval_loss)
        .Bind(16, p.elapsed_seconds).Bind(17, p.memory.device_allocated_bytes)
        .Bind(18, p.memory.device_peak_bytes).Bind(19, p.memory.master_weight_bytes)
        .Bind(20, p.memory.optimizer_state_bytes).Bind(21, p.memory.gradient_bytes)
        .Bind(22, p.memory.comm_buffer_bytes).Bind(23, p.memory.host_rss_bytes)
        .Bind(24, p.memory.device_reserved_peak_bytes).Bind(25, p.strategy.zero_stage)
        .Bind(26, p.strategy.world_size).Bind(27, p.strategy.trainable_elements)
        .Bind(28, p.strategy.partition_elements)
        .Bind(29, (p.strategy.partitioned_optimizer ? 1 : 0) | (p.strategy.partitioned_gradients ? 2 : 0))
        .Bind(30, p.epoch_records.trained).Bind(31, p.epoch_records.left_over)
        .Bind(32, p.epoch_records.malformed).Bind(33, p.epoch_records.without_target)
        .Bind(34, p.total_records.trained).Bind(35, p.total_records.left_over)
        .Bind(36, p.total_records.malformed).Bind(37, p.total_records.without_target)
        .Bind(38, p.checkpointing.checkpointed_layers).Bind(39, p.checkpointing.layers)
        .Bind(40, p.checkpointing.planned_peak_bytes).Bind(41, p.checkpointing.budget_bytes)
        .Bind(42, p.checkpointing.measured_peak_bytes).Bind(43, p.checkpointing.offloaded_layers)
        .Bind(44, p.checkpointing.dequantized_layers);
  }
  return s.Step().status();
}

absl::StatusOr<std::vector<JobEvent>> JobStore::LoadEvents(const std::string& job_id,
                                                           int64_t after_sequence) {
  Statement s(db_, absl::StrCat("SELECT ", kEventColumns,
                                " FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq").c_str());
  QLORA_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id).Bind(2, after_sequence);
  std::vector<JobEvent> events;
  while (true) {
    QLORA_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    events.push_back(ReadEvent(s));
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
