// Generation from a trained job (JobService.Generate): each session is one qlora-worker process
// started with --generate on a free local slot (leased from the JobManager, so a training job
// never shares its GPU), fed its task over WorkerService.GetGenerationTask, and reporting its
// text piece by piece (ReportGeneration), which the client's stream reads with Next. The worker
// authenticates with the session's own random token, good for that session only.
//
// A session ends with End: its process is asked to stop (SIGTERM, then SIGKILL after the grace),
// reaped, and its slot returned. A worker that ends without finishing, or sends nothing for
// `idle_timeout`, fails the session with its reported error or its log's last lines.
//
// Thread-safe; no file-system access under the lock (the session's log folder is made before).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/generate/generation_slots.h"
#include "qlora/v1/worker_service.pb.h"

namespace qlora::coordinator {

struct GenerationSessionsOptions {
  absl::Duration start_timeout = absl::Seconds(300);  // the worker asks for its task by then
  absl::Duration idle_timeout = absl::Seconds(300);   // a piece at least this often (model load)
  absl::Duration stop_grace = absl::Seconds(3);
  int max_sessions = 8;
  // A slot still held by the exiting worker of a job that just ended is free a moment later:
  // Start waits this long for one before it answers RESOURCE_EXHAUSTED.
  absl::Duration slot_wait = absl::Seconds(10);
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

struct GenerationStart {
  std::string job_id;
  std::string job_dir;                  // the session's log goes to <job_dir>/logs/generate-N.log
  std::vector<std::string> confine_read;  // with roots: what the worker may read
  v1::GenerationTask task;
};

class GenerationSessions {
 public:
  GenerationSessions(GenerationSlots* slots, GenerationSessionsOptions options = {});
  ~GenerationSessions();

  // Launches a session's worker; returns the session's id.
  absl::StatusOr<std::string> Start(GenerationStart start);
  // The pieces reported since the last call, waiting until `deadline` for one. `*finished` once
  // the last prompt's last piece is among them. An error when the session failed.
  absl::Status Next(const std::string& id, absl::Time deadline, std::vector<v1::GeneratedText>* pieces,
                    bool* finished);
  // Stops (if still running) and forgets the session; its slot is returned once its process
  // has ended.
  void End(const std::string& id);

  // The worker's calls. PERMISSION_DENIED for a wrong token; NOT_FOUND for an ended session.
  absl::StatusOr<v1::GenerationTask> Task(const std::string& id, const std::string& token);
  // Whether the worker should stop (false: a session whose client went away is ended, and the
  // worker's next call gets NOT_FOUND).
  absl::StatusOr<bool> Report(const std::string& id, const std::string& token,
                              const v1::GenerationReport& report);

 private:
  struct Session;
  absl::StatusOr<Session*> Authenticated(const std::string& id, const std::string& token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes the process's end, if it ended, failing a session that had not finished.
  void PollProcess(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  GenerationSlots* const slots_;
  const GenerationSessionsOptions options_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  int64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace qlora::coordinator
