// Durable job store on an embedded SQLite database: jobs, and every state change / progress
// event with its sequence number. A restarted coordinator reads everything back from here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_types.h"

struct sqlite3;

namespace qlora::coordinator {

class JobStore {
 public:
  // Opens (creating if needed) the database at `path` (":memory:" for a private one).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Inserts a new job or replaces the stored fields of an existing one (progress excluded).
  absl::Status PutJob(const JobRecord& job);
  absl::Status AppendEvent(const std::string& job_id, const JobEvent& event);
  // Every job, oldest first, with `progress` rebuilt from its latest progress events.
  absl::StatusOr<std::vector<JobRecord>> LoadJobs();
  absl::StatusOr<std::vector<JobEvent>> LoadEvents(const std::string& job_id, int64_t after_sequence);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql);
  sqlite3* db_;
};

}  // namespace qlora::coordinator
