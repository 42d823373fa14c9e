// One job in the coordinator: its record (what clients see and the store keeps), its parsed
// config, and its current start (the WorkerGroup, the Rendezvous and the shards). It carries out
// the job's state machine:
//
//   QUEUED -> STARTING (Start: workers launched) -> RUNNING (every rank registered)
//          -> SUCCEEDED (every rank reported success)
//   not yet ended -> FAILED (a rank failed, exited, went silent or never registered; the start
//                    failed) | CANCELLED (Cancel)
//   STARTING, RUNNING -> QUEUED (Requeue: the coordinator restarted)
//
// Every state change and progress report is recorded: sequence-numbered, persisted in the
// JobStore (the event and the job row in one transaction) and announced through
// JobEnv::changed. A failed write is reported to JobEnv::store_failed; the change stands in
// memory. The changes a caller is told about are durable first: the submission's write is
// checked by the caller (RecordSubmission), and a cancel or the last rank's completion that
// cannot be written is not made (Cancel, ReportCompletion). Ending the job stops its workers (SIGTERM, then SIGKILL after the grace) and closes
// its rendezvous.
//
// Not thread-safe: JobManager calls every method under its lock. Only the Rendezvous, which has
// its own lock, is waited on without it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/job_config.h"
#include "common/worker_protocol.h"
#include "coordinator/store/job_store.h"
#include "coordinator/jobs/job_types.h"
#include "coordinator/jobs/rendezvous.h"
#include "coordinator/jobs/shard_plan.h"
#include "coordinator/jobs/worker_group.h"
#include "coordinator/launch/worker_launch.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

// What every job of one JobManager shares (it outlives them).
struct JobEnv {
  JobStore* store = nullptr;
  std::function<absl::Time()> now;
  absl::Duration register_timeout;   // every rank registers within this of the start
  absl::Duration heartbeat_timeout;  // a running rank silent this long is lost
  absl::Duration stop_grace;         // SIGTERM, then SIGKILL after this
  std::function<void()> changed;     // a job recorded something: wake watchers and the monitor
  std::function<void(const absl::Status&)> store_failed;  // a state change was not persisted
  int default_max_restarts = 0;      // for jobs whose file does not say (trainer.max_restarts)
  absl::Duration restart_backoff;    // before the first restart; doubled for each next one
  std::function<void(const WorkerExit&)> worker_exited;  // every reaped rank (metrics); may be empty
  std::function<void()> ended;       // a job reached a terminal state; may be empty
};

class Job {
 public:
  Job(JobRecord record, JobConfig config, const JobEnv* env);
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const JobRecord& record() const { return record_; }
  const JobConfig& config() const { return config_; }
  const std::string& id() const { return record_.id; }
  JobState state() const { return record_.state; }
  bool ended() const { return IsTerminal(record_.state); }
  // An ended job's job files (up to 1 MiB each) leave memory once the store holds its end; the
  // store keeps them (JobStore::PutJob keeps stored files when given none) for whoever asks.
  void DropJobFiles() {
    record_.job_yaml.clear();
    record_.job_yaml.shrink_to_fit();
    record_.resolved_config_yaml.clear();
    record_.resolved_config_yaml.shrink_to_fit();
    job_files_dropped_ = true;
  }
  bool job_files_dropped() const { return job_files_dropped_; }
  const WorkerGroup& workers() const { return workers_; }
  // The current start's rendezvous; null before the first start.
  const std::shared_ptr<Rendezvous>& rendezvous() const { return rendezvous_; }

  // QUEUED (SUBMITTED): the new job's first record. The store's error when it could not be
  // written (the caller then drops the job); store_failed is not called.
  absl::Status RecordSubmission(const std::string& message);
  // Records a state change.
  void Transition(JobState state, const std::string& reason_code, const std::string& message);
  // FAILED (nothing once the job has ended); stops the workers.
  void Fail(const std::string& reason_code, const std::string& message);
  // A failure of the current start. While restarts remain and the failure is `retryable`: stops
  // the workers and queues the job again (RESTARTING, naming the cause and the attempt); the
  // monitor starts it anew, as a new generation with new startup tokens, once its old workers
  // are gone and the backoff has passed, and every rank resumes from the last checkpoint.
  // Otherwise FAILED, naming every earlier cause too.
  void FailOrRestart(const std::string& reason_code, const std::string& message, bool retryable = true);
  // Not to be started before this (the restart backoff); the infinite past otherwise.
  absl::Time not_before() const { return not_before_; }
  int max_restarts() const;
  // CANCELLED, written before anything else changes; then stops the workers. When the store
  // cannot record it, nothing changes (the job goes on), store_failed is called and the
  // store's error is returned. The job must not have ended.
  absl::Status Cancel();
  // QUEUED again, without progress: the coordinator restarted while the job started or ran.
  void Requeue();

  // Opens a new rendezvous generation and launches rank r through `launcher` (on slots[r] for
  // local processes) with `launch` (its per-job and per-rank fields are filled in here), to
  // read `shards`; then STARTING. The
  // shards were planned and the folders made beforehand, without the manager's lock
  // (start_prep.h): nothing here reads a dataset. On an error the workers launched so far are
  // being stopped; they hold their slots until they are reaped.
  // `world` is normally the job's num_workers; fewer for an elastic job (backend.trainer.
  // min_workers) whose workers are gone for good: then the start's config keeps the global batch
  // by raising gradient_accumulation_steps where it divides (else says how the batch changes),
  // and the event ELASTIC_RESIZE says so. The checkpoint is re-partitioned by the workers.
  absl::Status Start(WorkerLauncher* launcher, const std::vector<int>& slots, int world,
                     WorkerLaunchRequest launch, JobShards shards);
  // Reaps the workers that ended (a failure unless the job is stopping or the rank completed
  // and exited cleanly), SIGKILLs stragglers after the grace, and enforces the registration and
  // heartbeat deadlines. Returns the slots of the workers whose end was seen.
  std::vector<int> Poll();
  // The coordinator stops: SIGKILL to every worker, the rendezvous closed; then ReapKilled.
  void Kill();
  void ReapKilled() { workers_.ReapKilled(); }

  // Worker calls, once FindWorker has authenticated the token.
  WorkerProcess* FindWorker(const std::string& token) { return workers_.FindByToken(token); }
  // `host` (the address the call came from) and `pid` say where the rank runs, in messages.
  absl::Status Register(WorkerProcess& worker, int rank, const std::string& host, int64_t pid);
  // ABORTED once the job has ended.
  absl::StatusOr<WorkerAssignment> Assignment(WorkerProcess& worker, std::string nccl_unique_id);
  // Returns whether the worker should stop now.
  bool Heartbeat(WorkerProcess& worker);
  // Records the report; then the records left without a target so far (every rank's): a
  // RECORDS_WITHOUT_TARGET event the first time there are any and whenever their count has
  // doubled since, and the job fails (not retried) above data.max_without_target_fraction once
  // at least kRecordsToJudge records were read.
  void ReportProgress(WorkerProcess& worker, ProgressSnapshot progress);
  static constexpr int64_t kRecordsToJudge = 16;
  // A failure restarts the job when retryable and restarts remain (FailOrRestart). A success
  // must name the outputs the coordinator planned (`<output_dir>/adapter`, `<output_dir>/merged`):
  // any other path is PERMISSION_DENIED and changes nothing (a replayed token must not turn a
  // running job into a success with an adapter of its choosing). The last rank's success is
  // stored before it is acknowledged: the store's error otherwise, and nothing of it stands.
  absl::Status ReportCompletion(WorkerProcess& worker, const WorkerCompletion& completion);

 private:
  // Numbers, stamps and writes `event` with the job row.
  absl::Status Write(JobEvent event);
  // Write; a failure goes to store_failed. Wakes watchers either way.
  void Record(JobEvent event);
  // ReportProgress's look at the records left without a target.
  void CheckRecordsWithoutTarget();
  // The record's state, reason and message (and end time, for a terminal state).
  void SetState(JobState state, const std::string& reason_code, const std::string& message);
  // What follows a transition once recorded: a terminal state closes the rendezvous.
  void AfterTransition();
  // A transition a caller is told about: written first; when the store cannot record it the
  // record is as it was, store_failed is told, and the error (naming `what`) is returned.
  absl::Status TransitionDurably(JobState state, const std::string& reason_code,
                                 const std::string& message, const std::string& what);
  void FailOnExit(const WorkerExit& exit);
  void CheckDeadlines();
  double NowUnix() const;

  const JobEnv* const env_;
  bool job_files_dropped_ = false;
  JobRecord record_;
  JobConfig config_;                 // parsed once: at Submit, or at Load for a job that may run
  int64_t warned_without_target_ = 0;  // the count the last RECORDS_WITHOUT_TARGET event gave
  bool use_gpu_ = false;             // of the current start
  std::string placed_on_;            // of the current start: the launcher's Describe()
  std::string start_config_yaml_;    // of the current start: the resolved config its workers get
  WorkerGroup workers_;
  std::shared_ptr<Rendezvous> rendezvous_;
  JobShards shards_;
  absl::Time start_deadline_;        // every rank registers by then
  absl::Time not_before_ = absl::InfinitePast();
  // A rank's report of a failure that may be a symptom (a collective that failed because a peer
  // died): acted on after a short settle time, unless a rank's exit, the likelier cause, comes
  // first and is named before it.
  struct ReportedFailure {
    int rank;
    std::string message;
    absl::Time act_at;
  };
  std::optional<ReportedFailure> reported_failure_;
};

}  // namespace qlora::coordinator
