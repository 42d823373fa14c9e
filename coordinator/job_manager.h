// The coordinator's core, with no gRPC in it: accepts jobs, keeps the FIFO queue and the worker
// accounting, spawns one worker per slot, runs the rendezvous (registration, assignment, NCCL id
// relay, Gloo key/value store), follows progress and worker exits, cancels, and persists every
// state change in the JobStore. The gRPC services (job_service.h, worker_service.h) forward here.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/job_store.h"
#include "coordinator/job_types.h"
#include "coordinator/process_launcher.h"
#include "coordinator/shard_plan.h"

namespace qlora::coordinator {

struct JobManagerOptions {
  std::string state_dir;                       // jobs/<id>/{logs,output} live here
  std::string worker_binary;                   // path of qlora-worker
  int cpu_workers = 0;                         // CPU slots (used when `gpus` is empty)
  std::vector<int> gpus;                       // GPU ids; one worker per GPU
  absl::Duration register_timeout = absl::Seconds(120);
  absl::Duration heartbeat_timeout = absl::Seconds(60);
  absl::Duration stop_grace = absl::Seconds(3);  // SIGTERM, then SIGKILL after this
  absl::Duration poll_interval = absl::Milliseconds(50);
  std::string hf_hub_cache;                    // empty: the usual environment lookup
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

struct SubmitRequest {
  std::string job_yaml;
  std::string dataset;
  std::string validation_dataset;
  std::string name;
  std::string source_name = "job.yaml";
  std::string base_dir;              // relative paths in the file resolve here
};

using qlora::WorkerAssignment;

class JobManager {
 public:
  JobManager(JobManagerOptions options, JobStore* store, ProcessLauncher* launcher);
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

  // Clients.
  absl::StatusOr<std::string> Validate(const SubmitRequest& request) const;
  absl::StatusOr<JobRecord> Submit(const SubmitRequest& request);
  absl::StatusOr<JobRecord> Get(const std::string& id) const;
  std::vector<JobRecord> List(const std::set<JobState>& states) const;
  absl::StatusOr<JobRecord> Cancel(const std::string& id);
  // Events after `after_sequence`, waiting up to `deadline` for the first one. Empty when none
  // came in time; `*terminal` tells whether the job has ended.
  absl::StatusOr<std::vector<JobEvent>> WaitEvents(const std::string& id, int64_t after_sequence,
                                                   absl::Time deadline, bool* terminal) const;
  absl::StatusOr<std::string> LogPath(const std::string& id, int rank) const;

  // Workers. Every call is authenticated by (job id, startup token).
  absl::StatusOr<int64_t> Register(const std::string& job_id, const std::string& token, int rank,
                                   int64_t pid);
  absl::StatusOr<WorkerAssignment> GetAssignment(const std::string& job_id,
                                                 const std::string& token, absl::Time deadline);
  absl::Status PublishNcclId(const std::string& job_id, const std::string& token,
                             const std::string& id);
  absl::StatusOr<bool> Heartbeat(const std::string& job_id, const std::string& token);
  absl::Status ReportProgress(const std::string& job_id, const std::string& token,
                              const ProgressSnapshot& progress);
  absl::Status ReportCompletion(const std::string& job_id, const std::string& token, bool ok,
                                const std::string& error, const std::string& adapter_path);
  absl::Status StoreSet(const std::string& job_id, const std::string& token, int64_t generation,
                        const std::string& key, const std::string& value);
  absl::StatusOr<std::string> StoreGet(const std::string& job_id, const std::string& token,
                                       int64_t generation, const std::string& key,
                                       absl::Time deadline);

  int total_slots() const;

 private:
  struct Worker {
    int rank = 0;
    std::string token;
    pid_t pid = 0;
    bool registered = false;
    bool completed = false;          // reported success
    bool exited = false;
    absl::Time last_heartbeat;
    std::vector<int> slots;          // GPU ids (or CPU slot numbers)
  };
  struct LiveJob {
    JobRecord record;
    std::vector<Worker> workers;
    std::vector<std::vector<data::ShardSpec>> train_shards, validation_shards;
    std::string nccl_unique_id;
    int64_t generation = 0;
    absl::Time start_deadline;
    bool stopping = false;           // workers are being stopped
    absl::Time kill_at;              // SIGKILL the stragglers after this
    std::map<std::string, std::string> kv;  // rendezvous store of the current generation
    bool use_gpu = false;
  };

  void MonitorLoop();
  void Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartJob(LiveJob& job, std::vector<int> slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollWorkers(LiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a state change (persisted, sequence-numbered, wakes watchers).
  void Transition(LiveJob& job, JobState state, const std::string& reason_code,
                  const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AppendEvent(LiveJob& job, JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopWorkers(LiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(LiveJob& job, const std::string& reason_code, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<LiveJob*> FindForWorker(const std::string& job_id, const std::string& token,
                                         Worker** worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<int> FreeSlots() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "1, 3": the ranks of `job` that have not registered.
  static std::string UnregisteredRanks(const LiveJob& job);
  std::string JobDir(const std::string& id) const;
  double NowUnix() const;

  const JobManagerOptions options_;
  JobStore* const store_;
  ProcessLauncher* const launcher_;

  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;    // any event, registration, store write
  std::map<std::string, std::unique_ptr<LiveJob>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);   // submission order (FIFO)
  std::set<int> busy_slots_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_number_ ABSL_GUARDED_BY(mu_) = 1;
  std::string coordinator_address_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
};

}  // namespace qlora::coordinator
