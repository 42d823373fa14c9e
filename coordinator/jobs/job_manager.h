// The coordinator's core, with no gRPC in it: accepts jobs, keeps them in a strict-FIFO queue,
// starts a job when enough worker slots are free (or at once on a Ray cluster, whose placement
// group waits for room), runs the monitor thread that reaps workers and
// enforces deadlines, and authenticates the workers' calls before handing them to their Job.
// One Job (job.h) carries out each job's state machine; SlotPool says which slots are busy. The
// gRPC services (job_service.h, worker_service.h) forward here.
//
// Thread-safe. One lock (mu_) guards every job. Calls that wait (WaitEvents, GetAssignment,
// StoreGet) wait on a condition variable or on the job's Rendezvous, never holding mu_ while a
// Rendezvous waits. Nothing that touches a path a job names runs under mu_: Submit and Validate
// check the datasets (stat only) before taking it, and the monitor plans a start's shards and
// makes its folders with it released (start_prep.h). Worker processes are launched only from
// the monitor thread (StartMonitor), or from the caller of PollOnce in tests.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/job_config.h"
#include "coordinator/jobs/job.h"
#include "coordinator/store/job_store.h"
#include "coordinator/jobs/job_types.h"
#include "coordinator/launch/local_worker_launcher.h"
#include "coordinator/admission/path_confinement.h"
#include "coordinator/launch/process_launcher.h"
#include "coordinator/launch/slot_pool.h"
#include "coordinator/jobs/start_prep.h"
#include "coordinator/generate/generation_slots.h"

namespace qlora::coordinator {

// The defaults here are also the defaults of qlora-coordinator's flags.
struct JobManagerOptions {
  std::string state_dir;                       // jobs/<id>/{logs,output} live here
  std::string worker_binary;                   // path of qlora-worker
  int cpu_workers = 0;                         // CPU slots (used when `gpus` is empty)
  std::vector<int> gpus;                       // GPU ids; one worker per GPU
  // Spawned workers must all register within this (a cold start loads the model first).
  absl::Duration register_timeout = absl::Seconds(300);
  // A registered worker silent this long counts as lost (it heartbeats every 2 s).
  absl::Duration heartbeat_timeout = absl::Seconds(120);
  absl::Duration stop_grace = absl::Seconds(3);  // SIGTERM, then SIGKILL after this
  // Automatic restarts after a worker failure, for jobs whose file does not set
  // trainer.max_restarts; the first waits restart_backoff, each next one twice as long.
  int default_max_restarts = 2;
  absl::Duration restart_backoff = absl::Seconds(5);
  absl::Duration poll_interval = absl::Milliseconds(50);
  std::string hf_hub_cache;                    // empty: the usual environment lookup
  // The folders jobs may read from and write to (path_confinement.h); empty = anywhere.
  PathRoots roots;
  // With roots: each worker confines its own file accesses to the read roots and its job's output
  // folder (Landlock; worker/service/file_confinement.h), so the roots hold at the moment of use.
  bool confine_workers = true;
  // Added to every worker's environment (how to dial the coordinator over TLS).
  std::map<std::string, std::string> worker_env;
  // Submit answers RESOURCE_EXHAUSTED while this many jobs are queued (a flood of submissions
  // would otherwise grow the queue, the store and every scheduling pass without bound).
  int max_queued_jobs = 10000;
  // The same for one user's queued jobs (0 = no per-user cap), so one user cannot fill the queue.
  int max_queued_jobs_per_user = 0;
  // Retention of ended jobs: each user keeps the newest this many (by end time; 0 = all), and
  // none older than ended_job_retention after its end (0 = no age limit). A forgotten job's row,
  // events and folder in the state folder (its logs, and its outputs unless the job named an
  // output_dir elsewhere) are removed; its id is never given again. Without it a user's
  // submit-and-cancel loop grows memory, the store and the folder without bound.
  int max_ended_jobs_per_user = 1000;
  absl::Duration ended_job_retention = absl::ZeroDuration();
  std::function<absl::Time()> now = [] { return absl::Now(); };
  // Called for every worker process (rank) whose end was seen, under the manager's lock: it must
  // not call the manager nor block (metrics count the ends by cause).
  std::function<void(const WorkerExit&)> on_worker_exit;
  // Called once, when the coordinator turns unhealthy (a state change could not be written to
  // the store; see Health()). Runs under the manager's lock: it must not call the manager.
  std::function<void(const absl::Status&)> on_unhealthy;
};

struct SubmitRequest {
  std::string job_yaml;
  std::string dataset;
  std::string validation_dataset;
  std::string name;
  std::string source_name = "job.yaml";
  std::string base_dir;              // relative paths in the file resolve here
  std::string owner;                 // the authenticated user submitting it
  // The job this one continues from its newest checkpoint (resume_plan.h), read by the caller
  // after checking that the submitter may read it. With no job_yaml, its resolved file is used.
  std::optional<JobRecord> continues;
};

using qlora::WorkerAssignment;

// Every job and the slots, copied at one instant (JobManager::Snapshot), for the metrics and the
// status page to render without the manager's lock. The job files are left out.
struct ManagerSnapshot {
  std::vector<JobRecord> jobs;       // submission order; job_yaml and resolved_config_yaml empty
  int slots_total = 0;               // GPU ids or CPU slots of this host
  int slots_busy = 0;                // held by a live local worker process
  bool gpu = false;                  // the slots are GPUs
};

class JobManager : public GenerationSlots {
 public:
  // `processes` runs local workers (backend.type: local); `cluster`, when not null, runs the
  // workers of jobs with backend.type: ray (a RayWorkerLauncher). Both outlive the manager.
  JobManager(JobManagerOptions options, JobStore* store, ProcessLauncher* processes,
             WorkerLauncher* cluster = nullptr);
  ~JobManager();

  // Loads the stored jobs (a job that was starting or running when the previous coordinator
  // stopped is queued again). Call before serving requests.
  absl::Status Load();
  // Starts the monitor thread, which schedules and spawns workers. Call once the address is set.
  void StartMonitor();
  // The host:port workers dial; set once the server is bound, before StartMonitor().
  void SetCoordinatorAddress(std::string address);
  // Stops every worker and the monitor thread. Idempotent.
  void Shutdown();
  // One pass of what the monitor thread does every poll_interval: reaps exited workers, enforces
  // the stop grace and the registration and heartbeat deadlines, starts queued jobs. For tests
  // that drive the manager without StartMonitor (with a fake launcher and clock).
  void PollOnce();

  // OK until a state change could not be written to the store; then, until the process ends,
  // that first failure: the store no longer says what memory holds. While unhealthy, Submit is
  // refused (UNAVAILABLE) and no queued job is started; started jobs go on, and each later
  // successful write of a job brings its stored row up to date.
  absl::Status Health() const;

  // Clients.
  absl::StatusOr<std::string> Validate(const SubmitRequest& request) const;
  // UNAVAILABLE, keeping nothing, when the store cannot record the new job.
  absl::StatusOr<JobRecord> Submit(const SubmitRequest& request);
  // With its job files (an ended job's come from the store).
  absl::StatusOr<JobRecord> Get(const std::string& id) const;
  // Fills in `record`'s job files from the store when memory no longer holds them (an ended job:
  // List's records leave them empty).
  absl::Status FillJobFiles(JobRecord* record) const;
  // Jobs in submission order whose state is in `states` (empty = all) and whose owner is
  // `owner` (nullopt = anyone's): at most `page_size` after the job `after_id` ("" = from the
  // first). `*next_id` is the id to pass as `after_id` for the next page, "" after the last.
  // INVALID_ARGUMENT for an `after_id` that names no job.
  absl::StatusOr<std::vector<JobRecord>> List(const std::set<JobState>& states,
                                              const std::optional<std::string>& owner, int page_size,
                                              const std::string& after_id,
                                              std::string* next_id) const;
  absl::StatusOr<JobRecord> Cancel(const std::string& id);
  // Every job (without its job files) and the slots in use, copied under the lock.
  ManagerSnapshot Snapshot() const;
  // Events after `after_sequence`, waiting up to `deadline` for the first one. Empty when none
  // came in time; `*terminal` tells whether the job has ended.
  absl::StatusOr<std::vector<JobEvent>> WaitEvents(const std::string& id, int64_t after_sequence,
                                                   absl::Time deadline, bool* terminal) const;
  absl::StatusOr<std::string> LogPath(const std::string& id, int rank) const;

  // Workers. Every call is authenticated by (job id, startup token).
  // `host`: the address the call came from ("" when unknown), shown with `pid` in messages.
  absl::Status Register(const std::string& job_id, const std::string& token, int rank, int64_t pid,
                        const std::string& host = "");
  absl::StatusOr<WorkerAssignment> GetAssignment(const std::string& job_id,
                                                 const std::string& token, absl::Time deadline);
  absl::Status PublishNcclId(const std::string& job_id, const std::string& token,
                             const std::string& id);
  absl::StatusOr<bool> Heartbeat(const std::string& job_id, const std::string& token);
  absl::Status ReportProgress(const std::string& job_id, const std::string& token,
                              const ProgressSnapshot& progress);
  absl::Status ReportCompletion(const std::string& job_id, const std::string& token,
                                const WorkerCompletion& completion);
  absl::Status StoreSet(const std::string& job_id, const std::string& token, int64_t generation,
                        const std::string& key, const std::string& value);
  absl::StatusOr<std::string> StoreGet(const std::string& job_id, const std::string& token,
                                       int64_t generation, const std::string& key,
                                       absl::Time deadline);

  int total_slots() const { return total_slots_; }

  // Generation sessions (generation_slots.h) run on this host's free slots, which queued jobs
  // then wait for like any busy slot. FAILED_PRECONDITION without local slots.
  absl::StatusOr<int> Lease() override;
  void Return(int slot) override;
  WorkerLaunchRequest LaunchBasics() const override;
  WorkerLauncher* launcher() override { return &local_; }
  // The job's folder in the state folder (its logs).
  std::string JobDir(const std::string& id) const;
  // The read roots, resolved and as written (the files of a job are opened beneath them).
  std::vector<std::string> ReadRoots() const;

 private:
  // A worker's call, authenticated: its job and its process entry.
  struct WorkerCall {
    Job* job;
    WorkerProcess* worker;
  };
  // What a worker waits on without the lock: its job's rendezvous, and its rank there.
  struct RendezvousSeat {
    std::shared_ptr<Rendezvous> rendezvous;
    int rank = 0;
  };

  void MonitorLoop();
  // One pass: reaps, enforces deadlines, and starts the FIFO's next job if it fits, preparing
  // it with mu_ released (so mu_ is not held throughout). Returns whether it tried a start:
  // then the next queued job may be startable at once.
  bool Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The start the strict FIFO calls for now: the oldest queued job, when enough slots are free
  // (a job that can never fit fails; one that must wait says so). nullopt when there is none,
  // or while the coordinator is unhealthy.
  std::optional<StartRequest> NextStart() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts `request`'s job with what PrepareStart gave, if the FIFO still calls for it (the
  // queue may have changed while mu_ was released); otherwise drops the preparation.
  void StartPrepared(const StartRequest& request, absl::StatusOr<JobShards> prepared)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the ended jobs the retention policy no longer keeps: their rows and events under the
  // lock, their folders with it released. Returns how many it forgot.
  int ForgetEndedJobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets ended jobs' job files go from memory once their end is stored (Job::DropJobFiles).
  void DropEndedJobFiles() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Says (once per change) what a queued job waits for and who holds the slots.
  void WaitForSlots(Job& job, int free) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `world`: the workers of this start (fewer than the job's when it is elastic and some are gone).
  void StartJob(Job& job, std::vector<int> slots, int world, JobShards shards) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Job& Add(std::unique_ptr<Job> job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JobEnv::store_failed: logs, and turns the coordinator unhealthy on the first failure. Called
  // by a Job, under mu_.
  void StoreFailed(const absl::Status& status);
  absl::StatusOr<Job*> Find(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<WorkerCall> FindForWorker(const std::string& job_id, const std::string& token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's rendezvous, looked up under the lock, for a wait made without it.
  absl::StatusOr<RendezvousSeat> SeatFor(const std::string& job_id, const std::string& token)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Parses and checks a submission: its datasets (stat only) and where it can run (this
  // coordinator's slots, or the Ray cluster). Sets backend.num_workers when the file left it 0.
  // A continued job (request.continues, its job file filled in by WithContinuedJobFile) starts
  // from the other's checkpoint, and `note` (when given) says so and what changed.
  absl::StatusOr<JobConfig> ParseSubmission(const SubmitRequest& request, std::string* note = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The workers a job's start gets: whether on GPUs, and how many threads each.
  bool RunsOnGpus(const JobConfig& config) const;

  const JobManagerOptions options_;
  const int total_slots_;
  LocalWorkerLauncher local_;        // backend.type: local
  WorkerLauncher* const cluster_;    // backend.type: ray; null without --ray-address
  const JobEnv env_;                 // what every Job shares; outlives them

  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;    // a job recorded an event; the monitor and WaitEvents wait
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);   // submission order (FIFO)
  SlotPool slots_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_number_ ABSL_GUARDED_BY(mu_) = 1;
  std::string coordinator_address_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Retention's pass (ForgetEndedJobs, DropEndedJobFiles) is due: a job ended or its workers
  // were reaped since the last one; else it runs every kHousekeepingInterval.
  static constexpr absl::Duration kHousekeepingInterval = absl::Seconds(60);
  bool housekeeping_due_ ABSL_GUARDED_BY(mu_) = true;
  absl::Time last_housekeeping_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status store_error_ ABSL_GUARDED_BY(mu_);  // the first failed state-change write
  std::thread monitor_;
};

}  // namespace qlora::coordinator
