// Stores made before events were kept as serialized qlora.v1.JobEvent messages had an events
// table of positional columns, one per progress field. Opening such a store rewrites its events
// into the current table, once, in one transaction: the store opens as it was, or not at all.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/jobs/job_types.h"

struct sqlite3;

namespace qlora::coordinator::store_internal {

// Whether `db`'s events table is the positional one (it lacks the `event` column).
absl::StatusOr<bool> HasLegacyEventTable(sqlite3* db);

// Moves every event of the positional table into a new table made by `create_events_sql`
// (CREATE TABLE events ...), each through `append` (the store's own event write), and drops the
// old one; nothing changes on an error.
using AppendEventFn = std::function<absl::Status(const std::string& job_id, const JobEvent& event)>;
absl::Status MigrateLegacyEventTable(sqlite3* db, const char* create_events_sql,
                                     const AppendEventFn& append);

}  // namespace qlora::coordinator::store_internal
