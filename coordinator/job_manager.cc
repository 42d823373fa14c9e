// The coordinator's core: queue, scheduling, job lifecycle and the worker calls (see
// job_manager.h).
#include "coordinator/job_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config_emit.h"
#include "common/config/job_config_parser.h"
#include "common/status_macros.h"
#include "coordinator/worker_launch.h"

namespace qlora::coordinator {
namespace {

std::string RandomToken() {
  std::random_device rd;
  return absl::StrFormat("%016x%016x", (uint64_t{rd()} << 32) | rd(), (uint64_t{rd()} << 32) | rd());
}

absl::Status EnsureDir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

JobManager::JobManager(JobManagerOptions options, JobStore* store, ProcessLauncher* launcher)
    : options_(std::move(options)),
      store_(store),
      launcher_(launcher),
      total_slots_(SlotPool(options_.gpus, options_.cpu_workers).total()),
      slots_(options_.gpus, options_.cpu_workers) {}

JobManager::~JobManager() { Shutdown(); }

double JobManager::NowUnix() const { return absl::ToDoubleSeconds(options_.now() - absl::UnixEpoch()); }

std::string JobManager::JobDir(const std::string& id) const {
  return absl::StrCat(options_.state_dir, "/jobs/", id);
}

void JobManager::SetCoordinatorAddress(std::string address) {
  absl::MutexLock lock(&mu_);
  coordinator_address_ = std::move(address);
}

absl::Status JobManager::Load() {
  QLORA_RETURN_IF_ERROR(EnsureDir(options_.state_dir + "/jobs"));
  QLORA_ASSIGN_OR_RETURN(std::vector<JobRecord> stored, store_->LoadJobs());
  absl::MutexLock lock(&mu_);
  for (JobRecord& record : stored) {
    auto job = std::make_unique<LiveJob>(launcher_);
    job->record = std::move(record);
    const std::string id = job->record.id;
    int number = 0;
    if (sscanf(id.c_str(), "job-%d", &number) == 1) {
      next_job_number_ = std::max<int64_t>(next_job_number_, number + 1);
    }
    LiveJob& ref = *job;
    order_.push_back(id);
    jobs_[id] = std::move(job);
    if (!IsTerminal(ref.record.state)) Restore(ref);
  }
  return absl::OkStatus();
}

void JobManager::Restore(LiveJob& job) {
  absl::StatusOr<JobConfig> config = ParseResolvedJobConfig(job.record.resolved_config_yaml);
  if (!config.ok()) {
    Fail(job, "START_FAILED", std::string(config.status().message()));
    return;
  }
  job.config = *std::move(config);
  if (job.record.state == JobState::kStarting || job.record.state == JobState::kRunning) {
    job.record.progress.clear();
    Transition(job, JobState::kQueued, "REQUEUED_AFTER_RESTART",
               "the coordinator restarted while this job ran; it is queued again");
  }
}

void JobManager::StartMonitor() {
  // Only the monitor thread starts workers: PR_SET_PDEATHSIG fires when the *thread* that
  // forked a worker ends, and gRPC's handler threads come and go.
  monitor_ = std::thread([this] { MonitorLoop(); });
}

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& [id, job] : jobs_) {
      job->workers.KillAll();
      if (job->rendezvous) job->rendezvous->Close("the coordinator is shutting down");
    }
    changed_.SignalAll();
  }
  if (monitor_.joinable()) monitor_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, job] : jobs_) job->workers.ReapKilled();
}

// ---------------------------------------------------------------------------------------------
// Clients

absl::StatusOr<JobConfig> JobManager::ParseSubmission(const SubmitRequest& request) const {
  ParseOptions parse;
  parse.source_name = request.source_name;
  parse.dataset_override = request.dataset;
  parse.validation_dataset_override = request.validation_dataset;
  parse.hf_hub_cache = options_.hf_hub_cache;
  parse.base_dir = request.base_dir;
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseJobConfig(request.job_yaml, parse));
  if (!request.name.empty()) config.name = request.name;
  if (total_slots_ == 0) {
    return absl::FailedPreconditionError("this coordinator has no GPUs and no --cpu-workers");
  }
  if (config.backend.num_workers > total_slots_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend.trainer.num_workers: the job asks for ", config.backend.num_workers,
        " workers but this coordinator has only ", total_slots_));
  }
  return config;
}

absl::StatusOr<std::string> JobManager::Validate(const SubmitRequest& request) const {
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseSubmission(request));
  return EmitResolvedJobYaml(config);
}

absl::StatusOr<JobRecord> JobManager::Submit(const SubmitRequest& request) {
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseSubmission(request));
  std::string resolved = EmitResolvedJobYaml(config);
  absl::MutexLock lock(&mu_);
  auto job = std::make_unique<LiveJob>(launcher_);
  JobRecord& r = job->record;
  r.id = absl::StrFormat("job-%06d", next_job_number_++);
  r.name = config.name;
  r.state = JobState::kQueued;
  r.created_unix = NowUnix();
  r.job_yaml = request.job_yaml;
  r.resolved_config_yaml = std::move(resolved);
  r.num_workers = config.backend.num_workers > 0 ? config.backend.num_workers : total_slots_;
  r.zero_stage = config.backend.strategy.zero_stage;
  r.output_dir = config.output_dir.empty() ? JobDir(r.id) + "/output" : config.output_dir;
  job->config = std::move(config);
  LiveJob& ref = *job;
  order_.push_back(r.id);
  jobs_[r.id] = std::move(job);
  Transition(ref, JobState::kQueued, "SUBMITTED",
             absl::StrCat("accepted; ", r.num_workers, " workers, ZeRO stage ", r.zero_stage));
  return ref.record;  // the monitor thread, woken by the event, schedules it
}

absl::StatusOr<JobManager::LiveJob*> JobManager::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second.get();
}

absl::StatusOr<JobRecord> JobManager::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(const LiveJob* job, Find(id));
  return job->record;
}

std::vector<JobRecord> JobManager::List(const std::set<JobState>& states) const {
  absl::MutexLock lock(&mu_);
  std::vector<JobRecord> out;
  for (const std::string& id : order_) {
    const JobRecord& r = jobs_.at(id)->record;
    if (states.empty() || states.count(r.state)) out.push_back(r);
  }
  return out;
}

absl::StatusOr<JobRecord> JobManager::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, Find(id));
  if (IsTerminal(job->record.state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " has already ended (", JobStateName(job->record.state), ")"));
  }
  job->workers.Stop(options_.now() + options_.stop_grace);
  Transition(*job, JobState::kCancelled, "CANCELLED_BY_USER", "cancelled by a client");
  return job->record;
}

absl::StatusOr<std::vector<JobEvent>> JobManager::WaitEvents(const std::string& id,
                                                             int64_t after_sequence,
                                                             absl::Time deadline,
                                                             bool* terminal) const {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(const LiveJob* job, Find(id));
  const JobRecord& r = job->record;
  while (r.last_sequence <= after_sequence && !IsTerminal(r.state) && !stop_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  *terminal = IsTerminal(r.state);
  if (stop_ && r.last_sequence <= after_sequence) {
    return absl::UnavailableError("the coordinator is shutting down; watch again to resume");
  }
  if (r.last_sequence <= after_sequence) return std::vector<JobEvent>{};
  return store_->LoadEvents(id, after_sequence);
}

absl::StatusOr<std::string> JobManager::LogPath(const std::string& id, int rank) const {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(const LiveJob* job, Find(id));
  if (rank < 0 || rank >= job->record.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in job ", id, " (",
                                                   job->record.num_workers, " workers)"));
  }
  return WorkerLogPath(JobDir(id), rank);
}

// ---------------------------------------------------------------------------------------------
// Scheduling and the worker lifecycle

void JobManager::ScheduleQueued() {
  // Strict FIFO: the oldest queued job starts first; later ones wait behind it.
  for (const std::string& id : order_) {
    LiveJob& job = *jobs_.at(id);
    if (job.record.state != JobState::kQueued) continue;
    const int need = job.record.num_workers;
    if (need > total_slots_) {  // e.g. queued again after a restart with fewer GPUs
      Fail(job, "NOT_ENOUGH_WORKERS",
           absl::StrCat("the job needs ", need, " workers; this coordinator has ", total_slots_));
      continue;
    }
    std::vector<int> free = slots_.Free();
    if (static_cast<int>(free.size()) < need) {
      WaitForSlots(job, static_cast<int>(free.size()));
      return;
    }
    free.resize(need);
    absl::Status started = StartJob(job, free);
    if (!started.ok()) Fail(job, "START_FAILED", std::string(started.message()));
  }
}

void JobManager::WaitForSlots(LiveJob& job, int free) {
  std::vector<std::string> holders;  // jobs with a live worker process
  for (const std::string& other : order_) {
    if (jobs_.at(other)->workers.AnyAlive()) holders.push_back(other);
  }
  const std::string message = absl::StrCat(
      "waiting for workers: needs ", job.record.num_workers, ", ", free, " of ", total_slots_,
      " free", holders.empty() ? "" : absl::StrCat(" (held by ", absl::StrJoin(holders, ", "), ")"));
  if (job.record.reason_code != "WAITING_FOR_WORKERS" || job.record.message != message) {
    Transition(job, JobState::kQueued, "WAITING_FOR_WORKERS", message);
  }
}

absl::Status JobManager::StartJob(LiveJob& job, std::vector<int> slots) {
  JobRecord& r = job.record;
  const int world = r.num_workers;
  QLORA_ASSIGN_OR_RETURN(job.shards, PlanJobShards(job.config.data, world));
  const std::string dir = JobDir(r.id);
  QLORA_RETURN_IF_ERROR(EnsureDir(dir + "/logs"));
  QLORA_RETURN_IF_ERROR(EnsureDir(r.output_dir));
  const absl::Time now = options_.now();
  RendezvousOptions rendezvous;
  rendezvous.generation = absl::ToUnixMicros(now);
  rendezvous.world_size = world;
  rendezvous.relay_nccl_id = slots_.gpu();
  job.rendezvous = std::make_shared<Rendezvous>(rendezvous);
  job.workers = WorkerGroup(launcher_);
  job.start_deadline = now + options_.register_timeout;
  r.started_unix = NowUnix();
  r.progress.assign(world, ProgressSnapshot{});
  WorkerLaunchRequest launch;
  launch.worker_binary = options_.worker_binary;
  launch.coordinator_address = coordinator_address_;
  launch.job_id = r.id;
  launch.job_dir = dir;
  launch.world_size = world;
  launch.use_gpu = slots_.gpu();
  launch.host_cores = sysconf(_SC_NPROCESSORS_ONLN);
  for (int rank = 0; rank < world; ++rank) {
    launch.rank = rank;
    launch.slot = slots[rank];
    launch.startup_token = RandomToken();
    absl::Status launched = job.workers.Launch(rank, launch.slot, launch.startup_token,
                                               BuildWorkerLaunchSpec(launch), now);
    if (!launched.ok()) {
      job.workers.Stop(now + options_.stop_grace);
      return absl::InternalError(absl::StrCat("could not start rank ", rank, ": ", launched.message()));
    }
    slots_.Take(launch.slot);
  }
  Transition(job, JobState::kStarting, "WORKERS_STARTING",
             absl::StrCat("started ", world, slots_.gpu() ? " GPU" : " CPU",
                          " workers; waiting for them to register"));
  return absl::OkStatus();
}

void JobManager::Fail(LiveJob& job, const std::string& reason_code, const std::string& message) {
  if (IsTerminal(job.record.state)) return;
  job.workers.Stop(options_.now() + options_.stop_grace);
  Transition(job, JobState::kFailed, reason_code, message);
}

void JobManager::PollWorkers(LiveJob& job) {
  for (const WorkerExit& exit : job.workers.Reap()) {
    slots_.Release(exit.slot);
    const bool clean = !exit.info.signaled && exit.info.code == 0;
    if (!job.workers.stopping() && !(clean && exit.completed)) {
      Fail(job, "WORKER_EXITED",
           absl::StrCat("rank ", exit.rank, " (pid ", exit.pid, ") ended with ", exit.info.Describe(),
                        exit.completed ? "" : " before finishing", "; see `qloractl logs ",
                        job.record.id, " --rank ", exit.rank, "`"));
    }
  }
  job.workers.KillOverdue(options_.now());
  CheckDeadlines(job);
}

void JobManager::CheckDeadlines(LiveJob& job) {
  const absl::Time now = options_.now();
  if (job.record.state == JobState::kStarting && now > job.start_deadline) {
    Fail(job, "WORKER_REGISTRATION_TIMEOUT",
         absl::StrCat("rank(s) ", job.rendezvous->UnregisteredRanks(), " did not register within ",
                      absl::FormatDuration(options_.register_timeout)));
  }
  if (job.record.state == JobState::kRunning) {
    if (const WorkerProcess* w = job.workers.SilentSince(now - options_.heartbeat_timeout)) {
      Fail(job, "WORKER_HEARTBEAT_LOST",
           absl::StrCat("rank ", w->rank, " (pid ", w->pid, ") sent no heartbeat for ",
                        absl::FormatDuration(now - w->last_heartbeat)));
    }
  }
}

void JobManager::Tick() {
  for (const std::string& id : order_) {
    LiveJob& job = *jobs_.at(id);
    if (!job.workers.empty()) PollWorkers(job);
  }
  ScheduleQueued();
}

void JobManager::PollOnce() {
  absl::MutexLock lock(&mu_);
  if (!stop_) Tick();
}

void JobManager::MonitorLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    Tick();
    changed_.WaitWithTimeout(&mu_, options_.poll_interval);
  }
}

void JobManager::AppendEvent(LiveJob& job, JobEvent event) {
  event.sequence = ++job.record.last_sequence;
  event.time_unix = NowUnix();
  absl::Status s = store_->AppendEvent(job.record.id, event);
  if (s.ok()) s = store_->PutJob(job.record);
  if (!s.ok()) fprintf(stderr, "qlora-coordinator: job store: %s\n", std::string(s.message()).c_str());
  changed_.SignalAll();
}

void JobManager::Transition(LiveJob& job, JobState state, const std::string& reason_code,
                            const std::string& message) {
  JobRecord& r = job.record;
  r.state = state;
  r.reason_code = reason_code;
  r.message = message;
  if (IsTerminal(state)) {
    r.finished_unix = NowUnix();
    if (job.rendezvous) job.rendezvous->Close(absl::StrCat("job ", r.id, " has ended"));
  }
  JobEvent e;
  e.state = state;
  e.reason_code = reason_code;
  e.message = message;
  AppendEvent(job, std::move(e));
}

// ---------------------------------------------------------------------------------------------
// Workers

absl::StatusOr<JobManager::WorkerCall> JobManager::FindForWorker(const std::string& job_id,
                                                                 const std::string& token) {
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, Find(job_id));
  WorkerProcess* worker = job->workers.FindByToken(token);
  if (worker == nullptr) return absl::PermissionDeniedError("unknown startup token for this job");
  return WorkerCall{job, worker};  // a job with workers has its rendezvous (StartJob)
}

absl::StatusOr<JobManager::RendezvousSeat> JobManager::SeatFor(const std::string& job_id,
                                                               const std::string& token) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return RendezvousSeat{call.job->rendezvous, call.worker->rank};
}

absl::Status JobManager::Register(const std::string& job_id, const std::string& token, int rank,
                                  int64_t pid) {
  (void)pid;  // the launcher knows the pid; the worker's own is only informative
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  LiveJob& job = *call.job;
  if (call.worker->rank != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("token belongs to rank ", call.worker->rank, ", not ", rank));
  }
  if (IsTerminal(job.record.state)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has ended"));
  }
  QLORA_RETURN_IF_ERROR(job.rendezvous->Register(rank));
  call.worker->last_heartbeat = options_.now();
  if (job.record.state == JobState::kStarting && job.rendezvous->AllRegistered()) {
    // Ranks that registered early waited in GetAssignment without heartbeats: the clock of
    // every rank starts now.
    job.workers.TouchAll(options_.now());
    Transition(job, JobState::kRunning, "ALL_WORKERS_REGISTERED",
               absl::StrCat(job.workers.size(), " workers registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerAssignment> JobManager::GetAssignment(const std::string& job_id,
                                                           const std::string& token,
                                                           absl::Time deadline) {
  QLORA_ASSIGN_OR_RETURN(RendezvousSeat seat, SeatFor(job_id, token));
  // Waits without the manager's lock: the other ranks register meanwhile.
  QLORA_ASSIGN_OR_RETURN(std::string nccl_id, seat.rendezvous->AwaitPeers(seat.rank, deadline));
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  const LiveJob& job = *call.job;
  if (IsTerminal(job.record.state) || stop_ || job.rendezvous != seat.rendezvous) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " has ended"));
  }
  call.worker->last_heartbeat = options_.now();  // the heartbeat thread starts after the assignment
  WorkerAssignment a;
  a.job_id = job_id;
  a.rank = seat.rank;
  a.world_size = job.workers.size();
  a.device = slots_.gpu() ? "cuda" : "cpu";
  a.resolved_config_yaml = job.record.resolved_config_yaml;
  a.train_shards = job.shards.train[seat.rank];
  a.validation_shards = job.shards.validation[seat.rank];
  a.nccl_unique_id = std::move(nccl_id);
  a.generation = job.rendezvous->generation();
  a.output_dir = job.record.output_dir;
  return a;
}

absl::Status JobManager::PublishNcclId(const std::string& job_id, const std::string& token,
                                       const std::string& id) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return call.job->rendezvous->PublishNcclId(call.worker->rank, id);
}

absl::StatusOr<bool> JobManager::Heartbeat(const std::string& job_id, const std::string& token) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  call.worker->last_heartbeat = options_.now();
  return IsTerminal(call.job->record.state) || call.job->workers.stopping();
}

absl::Status JobManager::ReportProgress(const std::string& job_id, const std::string& token,
                                        const ProgressSnapshot& progress) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  JobRecord& r = call.job->record;
  if (IsTerminal(r.state)) return absl::OkStatus();
  call.worker->last_heartbeat = options_.now();
  ProgressSnapshot p = progress;
  p.rank = call.worker->rank;
  if (static_cast<int>(r.progress.size()) <= p.rank) r.progress.resize(p.rank + 1);
  r.progress[p.rank] = p;
  JobEvent e;
  e.state = r.state;
  e.reason_code = "PROGRESS";
  e.progress = p;
  AppendEvent(*call.job, std::move(e));
  return absl::OkStatus();
}

absl::Status JobManager::ReportCompletion(const std::string& job_id, const std::string& token,
                                          bool ok, const std::string& error,
                                          const std::string& adapter_path) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  LiveJob& job = *call.job;
  JobRecord& r = job.record;
  if (IsTerminal(r.state)) return absl::OkStatus();
  if (!ok) {
    Fail(job, "WORKER_FAILED", absl::StrCat("rank ", call.worker->rank, ": ", error));
    return absl::OkStatus();
  }
  call.worker->completed = true;
  if (call.worker->rank == 0 && !adapter_path.empty()) r.adapter_path = adapter_path;
  if (job.workers.AllCompleted()) {
    // A rank stuck in its exit (e.g. a CUDA/NCCL teardown) must not hold its slot forever.
    job.workers.ExpectExit(options_.now() + 10 * options_.stop_grace);
    Transition(job, JobState::kSucceeded, "COMPLETED",
               r.adapter_path.empty() ? "training finished"
                                      : absl::StrCat("adapter written to ", r.adapter_path));
  }
  return absl::OkStatus();
}

absl::Status JobManager::StoreSet(const std::string& job_id, const std::string& token,
                                  int64_t generation, const std::string& key,
                                  const std::string& value) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return call.job->rendezvous->Set(generation, key, value);
}

absl::StatusOr<std::string> JobManager::StoreGet(const std::string& job_id, const std::string& token,
                                                 int64_t generation, const std::string& key,
                                                 absl::Time deadline) {
  QLORA_ASSIGN_OR_RETURN(RendezvousSeat seat, SeatFor(job_id, token));
  return seat.rendezvous->Get(generation, key, deadline);  // waits without the manager's lock
}

}  // namespace qlora::coordinator
