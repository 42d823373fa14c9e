// Durable job store on an embedded SQLite database: jobs, and every state change / progress
// event with its sequence number (each event stored as its qlora.v1.JobEvent message, so the
// store needs no change when the message gains a field). A restarted coordinator reads
// everything back from here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/jobs/job_types.h"

struct sqlite3;

namespace qlora::coordinator {

struct JobStoreOptions {
  // SQLite's max_page_count for this connection; 0 keeps SQLite's. A value below the file's
  // size means "no room to grow": every write that needs a new page fails with SQLITE_FULL, as
  // on a full disk (tests force the fault this way).
  int64_t max_pages = 0;
  // Opens an existing store for reading only (SQLITE_OPEN_READONLY; no schema changes): a second
  // connection beside the coordinator's own, e.g. the status page's history reads, which then
  // need no lock of the manager (the store is in WAL mode, so readers do not block its writer).
  bool read_only = false;
};

// Every write returns its error: UNAVAILABLE when SQLite reports a condition of the disk or the
// file (SQLITE_FULL, IOERR, BUSY, READONLY, ...), INTERNAL otherwise; the message names the SQLite
// code and, when the OS reported one, the errno (e.g. "SQLITE_FULL, ENOSPC"). Not thread-safe.
class JobStore {
 public:
  // Opens (creating if needed) the database at `path` (":memory:" for a private one).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        const JobStoreOptions& options = {});
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Inserts a new job or replaces the stored fields of an existing one (progress excluded); empty
  // job files leave the stored ones as they are (an ended job's are kept only here).
  absl::Status PutJob(const JobRecord& job);
  absl::Status AppendEvent(const std::string& job_id, const JobEvent& event);
  // AppendEvent(job.id, event) and PutJob(job) in one transaction: both are kept or neither.
  absl::Status Record(const JobRecord& job, const JobEvent& event);
  // Every job, oldest first, with `progress` rebuilt from its latest progress events.
  absl::StatusOr<std::vector<JobRecord>> LoadJobs();
  absl::StatusOr<std::vector<JobEvent>> LoadEvents(const std::string& job_id, int64_t after_sequence);
  // Removes a job's row and events (retention), and notes that no new job may take a number
  // below `next_job_number` (its id must never come back), in one transaction.
  absl::Status ForgetJob(const std::string& job_id, int64_t next_job_number);
  // A job's job file and resolved job file as stored.
  absl::Status LoadJobFiles(const std::string& job_id, std::string* job_yaml,
                            std::string* resolved_yaml);
  // The highest next_job_number ForgetJob noted (0: none).
  absl::StatusOr<int64_t> NextJobNumber();

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status PutOutputs(const JobRecord& job);  // merged_path and summary (PutJob calls it)
  absl::Status Exec(const char* sql);
  sqlite3* db_;
};

}  // namespace qlora::coordinator
