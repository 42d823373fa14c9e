// The positional events table of older stores, read once to move it (see legacy_event_table.h).
#include "coordinator/store/legacy_event_table.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/store/sqlite_statement.h"

namespace qlora::coordinator::store_internal {
namespace {

// The columns later versions of the positional table gained; an older table gains them first,
// with the defaults those versions gave, so every row reads the same way.
const std::vector<const char*>& AddedColumns() {
  static const auto* const kColumns = new std::vector<const char*>{
      "dev_reserved INTEGER DEFAULT 0", "strategy_stage INTEGER DEFAULT -1",
      "strategy_world INTEGER DEFAULT 0", "strategy_trainable INTEGER DEFAULT 0",
      "strategy_partition INTEGER DEFAULT 0", "strategy_flags INTEGER DEFAULT 0",
      "epoch_trained INTEGER DEFAULT 0", "epoch_left_over INTEGER DEFAULT 0",
      "epoch_malformed INTEGER DEFAULT 0", "epoch_without_target INTEGER DEFAULT 0",
      "total_trained INTEGER DEFAULT 0", "total_left_over INTEGER DEFAULT 0",
      "total_malformed INTEGER DEFAULT 0", "total_without_target INTEGER DEFAULT 0",
      "ckpt_layers INTEGER DEFAULT -1", "ckpt_total INTEGER DEFAULT 0",
      "ckpt_planned INTEGER DEFAULT 0", "ckpt_budget INTEGER DEFAULT 0",
      "ckpt_measured INTEGER DEFAULT 0", "ckpt_offloaded INTEGER DEFAULT 0",
      "ckpt_dequantized INTEGER DEFAULT 0"};
  return *kColumns;
}

constexpr const char* kLegacyColumns =
    "job_id, seq, time, state, reason_code, message, has_progress, rank, step, total_steps, "
    "epoch, loss, lr, tokens_per_second, eval_loss, elapsed, dev_alloc, dev_peak, master, "
    "optim, grads, comm, rss, dev_reserved, strategy_stage, strategy_world, strategy_trainable, "
    "strategy_partition, strategy_flags, epoch_trained, epoch_left_over, epoch_malformed, "
    "epoch_without_target, total_trained, total_left_over, total_malformed, total_without_target, "
    "ckpt_layers, ckpt_total, ckpt_planned, ckpt_budget, ckpt_measured, ckpt_offloaded, "
    "ckpt_dequantized";

JobEvent ReadLegacyEvent(const Statement& s) {
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

absl::Status CopyLegacyEvents(sqlite3* db, const char* create_events_sql,
                              const AppendEventFn& append) {
  QLORA_RETURN_IF_ERROR(Exec(db, "ALTER TABLE events RENAME TO legacy_events"));
  QLORA_RETURN_IF_ERROR(Exec(db, create_events_sql));
  Statement read(db, absl::StrCat("SELECT ", kLegacyColumns, " FROM legacy_events").c_str());
  QLORA_RETURN_IF_ERROR(read.status());
  for (;;) {
    QLORA_ASSIGN_OR_RETURN(const bool row, read.Step());
    if (!row) break;
    QLORA_RETURN_IF_ERROR(append(read.Text(0), ReadLegacyEvent(read)));
  }
  return Exec(db, "DROP TABLE legacy_events");
}

}  // namespace

absl::StatusOr<bool> HasLegacyEventTable(sqlite3* db) {
  QLORA_ASSIGN_OR_RETURN(const std::set<std::string> columns, ColumnNames(db, "events"));
  return !columns.empty() && columns.count("event") == 0;
}

absl::Status MigrateLegacyEventTable(sqlite3* db, const char* create_events_sql,
                                     const AppendEventFn& append) {
  QLORA_RETURN_IF_ERROR(AddMissingColumns(db, "events", AddedColumns()));
  QLORA_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE"));
  absl::Status moved = CopyLegacyEvents(db, create_events_sql, append);
  if (moved.ok()) moved = Exec(db, "COMMIT");
  if (!moved.ok()) (void)Exec(db, "ROLLBACK");
  return moved;
}

}  // namespace qlora::coordinator::store_internal
