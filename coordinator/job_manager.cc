// The coordinator's core (see job_manager.h).
#include "coordinator/job_manager.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config_emit.h"
#include "common/config/job_config_parser.h"
#include "common/status_macros.h"

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

std::string JobManager::UnregisteredRanks(const LiveJob& job) {
  std::vector<std::string> missing;
  for (const Worker& w : job.workers) {
    if (!w.registered) missing.push_back(std::to_string(w.rank));
  }
  return absl::StrJoin(missing, ", ");
}

JobManager::JobManager(JobManagerOptions options, JobStore* store, ProcessLauncher* launcher)
    : options_(std::move(options)), store_(store), launcher_(launcher) {}

JobManager::~JobManager() { Shutdown(); }

int JobManager::total_slots() const {
  return options_.gpus.empty() ? options_.cpu_workers : static_cast<int>(options_.gpus.size());
}

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
  {
    absl::MutexLock lock(&mu_);
    for (JobRecord& record : stored) {
      auto job = std::make_unique<LiveJob>();
      job->record = std::move(record);
      int number = 0;
      if (sscanf(job->record.id.c_str(), "job-%d", &number) == 1) {
        next_job_number_ = std::max<int64_t>(next_job_number_, number + 1);
      }
      const std::string id = job->record.id;
      order_.push_back(id);
      LiveJob& ref = *job;
      jobs_[id] = std::move(job);
      if (ref.record.state == JobState::kStarting || ref.record.state == JobState::kRunning) {
        ref.record.progress.clear();
        Transition(ref, JobState::kQueued, "REQUEUED_AFTER_RESTART",
                   "the coordinator restarted while this job ran; it is queued again");
      }
    }
  }
  return absl::OkStatus();
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
      for (Worker& w : job->workers) {
        if (!w.exited) launcher_->Signal(w.pid, SIGKILL);
      }
    }
    changed_.SignalAll();
  }
  if (monitor_.joinable()) monitor_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, job] : jobs_) {
    for (Worker& w : job->workers) {
      // Reap what we killed so nothing is left as a zombie.
      for (int i = 0; i < 100 && !w.exited; ++i) {
        if (launcher_->Poll(w.pid)) w.exited = true; else usleep(10000);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Clients

absl::StatusOr<std::string> JobManager::Validate(const SubmitRequest& request) const {
  ParseOptions parse;
  parse.source_name = request.source_name;
  parse.dataset_override = request.dataset;
  parse.validation_dataset_override = request.validation_dataset;
  parse.hf_hub_cache = options_.hf_hub_cache;
  parse.base_dir = request.base_dir;
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseJobConfig(request.job_yaml, parse));
  if (!request.name.empty()) config.name = request.name;
  const int slots = total_slots();
  if (slots == 0) {
    return absl::FailedPreconditionError("this coordinator has no GPUs and no --cpu-workers");
  }
  if (config.backend.num_workers > slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend.trainer.num_workers: the job asks for ", config.backend.num_workers,
        " workers but this coordinator has only ", slots));
  }
  return EmitResolvedJobYaml(config);
}

absl::StatusOr<JobRecord> JobManager::Submit(const SubmitRequest& request) {
  QLORA_ASSIGN_OR_RETURN(std::string resolved, Validate(request));
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseResolvedJobConfig(resolved));
  absl::MutexLock lock(&mu_);
  auto job = std::make_unique<LiveJob>();
  JobRecord& r = job->record;
  r.id = absl::StrFormat("job-%06d", next_job_number_++);
  r.name = config.name;
  r.state = JobState::kQueued;
  r.created_unix = NowUnix();
  r.job_yaml = request.job_yaml;
  r.resolved_config_yaml = resolved;
  r.num_workers = config.backend.num_workers > 0 ? config.backend.num_workers : total_slots();
  r.zero_stage = config.backend.strategy.zero_stage;
  r.output_dir = config.output_dir.empty() ? JobDir(r.id) + "/output" : config.output_dir;
  LiveJob& ref = *job;
  order_.push_back(r.id);
  jobs_[r.id] = std::move(job);
  Transition(ref, JobState::kQueued, "SUBMITTED",
             absl::StrCat("accepted; ", r.num_workers, " workers, ZeRO stage ", r.zero_stage));
  return ref.record;  // the monitor thread, woken by the event, schedules it

}

absl::StatusOr<JobRecord> JobManager::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second->record;
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
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  LiveJob& job = *it->second;
  if (IsTerminal(job.record.state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " has already ended (", JobStateName(job.record.state), ")"));
  }
  StopWorkers(job);
  Transition(job, JobState::kCancelled, "CANCELLED_BY_USER", "cancelled by a client");
  return job.record;
}

absl::StatusOr<std::vector<JobEvent>> JobManager::WaitEvents(const std::string& id,
                                                             int64_t after_sequence,
                                                             absl::Time deadline,
                                                             bool* terminal) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const LiveJob& job = *it->second;
  while (job.record.last_sequence <= after_sequence && !IsTerminal(job.record.state) && !stop_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  *terminal = IsTerminal(job.record.state);
  if (stop_ && job.record.last_sequence <= after_sequence) {
    return absl::UnavailableError("the coordinator is shutting down; watch again to resume");
  }
  if (job.record.last_sequence <= after_sequence) return std::vector<JobEvent>{};
  return store_->LoadEvents(id, after_sequence);
}

absl::StatusOr<std::string> JobManager::LogPath(const std::string& id, int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (rank < 0 || rank >= it->second->record.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in job ", id, " (",
                                                   it->second->record.num_workers, " workers)"));
  }
  return absl::StrCat(JobDir(id), "/logs/rank-", rank, ".log");
}

// ---------------------------------------------------------------------------------------------
// Scheduling and the worker lifecycle

std::vector<int> JobManager::FreeSlots() const {
  std::vector<int> all = options_.gpus;
  if (all.empty()) {
    for (int i = 0; i < options_.cpu_workers; ++i) all.push_back(i);
  }
  std::vector<int> free;
  for (int s : all) {
    if (!busy_slots_.count(s)) free.push_back(s);
  }
  return free;
}

void JobManager::ScheduleQueued() {
  // Strict FIFO: the oldest queued job starts first; later ones wait behind it.
  for (const std::string& id : order_) {
    LiveJob& job = *jobs_.at(id);
    if (job.record.state != JobState::kQueued) continue;
    const int need = job.record.num_workers;
    if (need > total_slots()) {  // e.g. queued again after a restart with fewer GPUs
      Fail(job, "NOT_ENOUGH_WORKERS",
           absl::StrCat("the job needs ", need, " workers; this coordinator has ", total_slots()));
      continue;
    }
    std::vector<int> free = FreeSlots();
    if (static_cast<int>(free.size()) < need) {
      std::vector<std::string> holders;  // jobs with a live worker process
      for (const std::string& other : order_) {
        const auto& workers = jobs_.at(other)->workers;
        if (std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return !w.exited; })) {
          holders.push_back(other);
        }
      }
      const std::string message = absl::StrCat(
          "waiting for workers: needs ", need, ", ", free.size(), " of ", total_slots(),
          " free", holders.empty() ? "" : absl::StrCat(" (held by ", absl::StrJoin(holders, ", "), ")"));
      if (job.record.reason_code != "WAITING_FOR_WORKERS" || job.record.message != message) {
        Transition(job, JobState::kQueued, "WAITING_FOR_WORKERS", message);
      }
      return;
    }
    free.resize(need);
    absl::Status started = StartJob(job, free);
    if (!started.ok()) Fail(job, "START_FAILED", std::string(started.message()));
  }
}

absl::Status JobManager::StartJob(LiveJob& job, std::vector<int> slots) {
  JobRecord& r = job.record;
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseResolvedJobConfig(r.resolved_config_yaml));
  const int world = r.num_workers;
  QLORA_ASSIGN_OR_RETURN(job.train_shards, PlanShardsForRanks(config.data.train_path, config.data.format, world));
  job.validation_shards.assign(world, {});
  if (!config.data.validation_path.empty()) {
    QLORA_ASSIGN_OR_RETURN(job.validation_shards,
                           PlanShardsForRanks(config.data.validation_path, config.data.format, world));
  }
  // Every rank runs the same collectives, so every rank needs data of each kind it uses.
  for (int rank = 0; rank < world; ++rank) {
    if (job.train_shards[rank].empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the dataset is too small to give each of the ", world, " workers a part of it"));
    }
    if (!config.data.validation_path.empty() && job.validation_shards[rank].empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the validation file has fewer records than the job's ", world, " workers"));
    }
  }
  const std::string dir = JobDir(r.id);
  QLORA_RETURN_IF_ERROR(EnsureDir(dir + "/logs"));
  QLORA_RETURN_IF_ERROR(EnsureDir(r.output_dir));
  job.use_gpu = !options_.gpus.empty();
  job.generation = absl::ToUnixMicros(options_.now());
  job.nccl_unique_id.clear();
  job.kv.clear();
  job.workers.clear();
  job.stopping = false;
  job.start_deadline = options_.now() + options_.register_timeout;
  r.started_unix = NowUnix();
  r.progress.assign(world, ProgressSnapshot{});
  for (int rank = 0; rank < world; ++rank) {
    Worker w;
    w.rank = rank;
    w.token = RandomToken();
    w.slots = {slots[rank]};
    LaunchSpec spec;
    spec.argv = {options_.worker_binary, "--coordinator", coordinator_address_, "--job",
                 r.id, "--rank", std::to_string(rank), "--token", w.token};
    if (job.use_gpu) {
      spec.env["CUDA_VISIBLE_DEVICES"] = std::to_string(slots[rank]);
      spec.argv.push_back("--device=cuda");
    } else {
      spec.env["CUDA_VISIBLE_DEVICES"] = "";
      const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN) / world);
      spec.env["OMP_NUM_THREADS"] = std::to_string(cores);
      spec.argv.push_back("--device=cpu");
    }
    spec.log_path = absl::StrCat(dir, "/logs/rank-", rank, ".log");
    absl::StatusOr<pid_t> pid = launcher_->Launch(spec);
    if (!pid.ok()) {
      StopWorkers(job);
      return absl::InternalError(absl::StrCat("could not start rank ", rank, ": ", pid.status().message()));
    }
    w.pid = *pid;
    w.last_heartbeat = options_.now();
    for (int s : w.slots) busy_slots_.insert(s);
    job.workers.push_back(std::move(w));
  }
  Transition(job, JobState::kStarting, "WORKERS_STARTING",
             absl::StrCat("started ", world, job.use_gpu ? " GPU" : " CPU", " workers; waiting for them to register"));
  return absl::OkStatus();
}

void JobManager::StopWorkers(LiveJob& job) {
  if (job.stopping) return;
  job.stopping = true;
  job.kill_at = options_.now() + options_.stop_grace;
  for (Worker& w : job.workers) {
    if (!w.exited) launcher_->Signal(w.pid, SIGTERM);
  }
}

void JobManager::Fail(LiveJob& job, const std::string& reason_code, const std::string& message) {
  if (IsTerminal(job.record.state)) return;
  StopWorkers(job);
  Transition(job, JobState::kFailed, reason_code, message);
}

void JobManager::PollWorkers(LiveJob& job) {
  const absl::Time now = options_.now();
  for (Worker& w : job.workers) {
    if (w.exited) continue;
    std::optional<ExitInfo> exit = launcher_->Poll(w.pid);
    if (!exit) continue;
    w.exited = true;
    for (int s : w.slots) busy_slots_.erase(s);
    const bool clean = !exit->signaled && exit->code == 0;
    if (!job.stopping && !(clean && w.completed)) {
      Fail(job, "WORKER_EXITED",
           absl::StrCat("rank ", w.rank, " (pid ", w.pid, ") ended with ", exit->Describe(),
                        w.completed ? "" : " before finishing", "; see `qloractl logs ",
                        job.record.id, " --rank ", w.rank, "`"));
    }
  }
  if (job.stopping && now >= job.kill_at) {
    for (Worker& w : job.workers) {
      if (!w.exited) launcher_->Signal(w.pid, SIGKILL);
    }
  }
  if (job.record.state == JobState::kStarting && now > job.start_deadline) {
    Fail(job, "WORKER_REGISTRATION_TIMEOUT",
         absl::StrCat("rank(s) ", UnregisteredRanks(job), " did not register within ",
                      absl::FormatDuration(options_.register_timeout)));
  }
  if (job.record.state == JobState::kRunning) {
    for (const Worker& w : job.workers) {
      if (!w.completed && !w.exited && now - w.last_heartbeat > options_.heartbeat_timeout) {
        Fail(job, "WORKER_HEARTBEAT_LOST",
             absl::StrCat("rank ", w.rank, " (pid ", w.pid, ") sent no heartbeat for ",
                          absl::FormatDuration(now - w.last_heartbeat)));
        break;
      }
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
  if (IsTerminal(state)) r.finished_unix = NowUnix();
  JobEvent e;
  e.state = state;
  e.reason_code = reason_code;
  e.message = message;
  AppendEvent(job, std::move(e));
}

// ---------------------------------------------------------------------------------------------
// Workers

absl::StatusOr<JobManager::LiveJob*> JobManager::FindForWorker(const std::string& job_id,
                                                               const std::string& token,
                                                               Worker** worker) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  for (Worker& w : it->second->workers) {
    if (w.token == token) {
      *worker = &w;
      return it->second.get();
    }
  }
  return absl::PermissionDeniedError("unknown startup token for this job");
}

absl::StatusOr<int64_t> JobManager::Register(const std::string& job_id, const std::string& token,
                                             int rank, int64_t pid) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  if (w->rank != rank) {
    return absl::InvalidArgumentError(absl::StrCat("token belongs to rank ", w->rank, ", not ", rank));
  }
  if (IsTerminal(job->record.state)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has ended"));
  }
  w->registered = true;
  w->last_heartbeat = options_.now();
  (void)pid;
  const bool all = std::all_of(job->workers.begin(), job->workers.end(),
                               [](const Worker& x) { return x.registered; });
  if (all && job->record.state == JobState::kStarting) {
    // Ranks that registered early waited in GetAssignment without heartbeats: the clock of
    // every rank starts now.
    for (Worker& x : job->workers) x.last_heartbeat = options_.now();
    Transition(*job, JobState::kRunning, "ALL_WORKERS_REGISTERED",
               absl::StrCat(job->workers.size(), " workers registered"));
  }
  changed_.SignalAll();
  return job->generation;
}

absl::StatusOr<WorkerAssignment> JobManager::GetAssignment(const std::string& job_id,
                                                           const std::string& token,
                                                           absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  auto ready = [&] {
    if (IsTerminal(job->record.state) || stop_) return true;
    for (const Worker& x : job->workers) {
      if (!x.registered) return false;
    }
    return !job->use_gpu || !job->nccl_unique_id.empty() || w->rank == 0;
  };
  while (!ready()) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (IsTerminal(job->record.state) || stop_) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " has ended"));
  }
  if (!ready()) {
    const std::string missing = UnregisteredRanks(*job);
    return absl::DeadlineExceededError(missing.empty() ? "rank 0 has not published the NCCL id"
                                                       : absl::StrCat("waiting for rank(s) ", missing));
  }
  w->last_heartbeat = options_.now();  // the heartbeat thread starts after the assignment
  WorkerAssignment a;
  a.job_id = job_id;
  a.rank = w->rank;
  a.world_size = static_cast<int>(job->workers.size());
  a.device = job->use_gpu ? "cuda" : "cpu";
  a.resolved_config_yaml = job->record.resolved_config_yaml;
  a.train_shards = job->train_shards[w->rank];
  a.validation_shards = job->validation_shards[w->rank];
  a.nccl_unique_id = job->nccl_unique_id;
  a.generation = job->generation;
  a.output_dir = job->record.output_dir;
  return a;
}

absl::Status JobManager::PublishNcclId(const std::string& job_id, const std::string& token,
                                       const std::string& id) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  if (w->rank != 0) return absl::PermissionDeniedError("only rank 0 publishes the NCCL id");
  job->nccl_unique_id = id;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<bool> JobManager::Heartbeat(const std::string& job_id, const std::string& token) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  w->last_heartbeat = options_.now();
  return IsTerminal(job->record.state) || job->stopping;
}

absl::Status JobManager::ReportProgress(const std::string& job_id, const std::string& token,
                                        const ProgressSnapshot& progress) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  if (IsTerminal(job->record.state)) return absl::OkStatus();
  w->last_heartbeat = options_.now();
  ProgressSnapshot p = progress;
  p.rank = w->rank;
  if (static_cast<int>(job->record.progress.size()) <= p.rank) job->record.progress.resize(p.rank + 1);
  job->record.progress[p.rank] = p;
  JobEvent e;
  e.state = job->record.state;
  e.reason_code = "PROGRESS";
  e.progress = p;
  AppendEvent(*job, std::move(e));
  return absl::OkStatus();
}

absl::Status JobManager::ReportCompletion(const std::string& job_id, const std::string& token,
                                          bool ok, const std::string& error,
                                          const std::string& adapter_path) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  if (IsTerminal(job->record.state)) return absl::OkStatus();
  if (!ok) {
    Fail(*job, "WORKER_FAILED", absl::StrCat("rank ", w->rank, ": ", error));
    return absl::OkStatus();
  }
  w->completed = true;
  if (w->rank == 0 && !adapter_path.empty()) job->record.adapter_path = adapter_path;
  const bool all = std::all_of(job->workers.begin(), job->workers.end(),
                               [](const Worker& x) { return x.completed; });
  if (all) {
    // A rank stuck in its exit (e.g. a CUDA/NCCL teardown) must not hold its slot forever.
    job->stopping = true;
    job->kill_at = options_.now() + 10 * options_.stop_grace;
    Transition(*job, JobState::kSucceeded, "COMPLETED",
               job->record.adapter_path.empty() ? "training finished"
                                                : absl::StrCat("adapter written to ", job->record.adapter_path));
  }
  return absl::OkStatus();
}

absl::Status JobManager::StoreSet(const std::string& job_id, const std::string& token,
                                  int64_t generation, const std::string& key,
                                  const std::string& value) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  if (generation != job->generation) {
    return absl::FailedPreconditionError(absl::StrCat("stale rendezvous generation ", generation));
  }
  job->kv[key] = value;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobManager::StoreGet(const std::string& job_id, const std::string& token,
                                                 int64_t generation, const std::string& key,
                                                 absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  Worker* w = nullptr;
  QLORA_ASSIGN_OR_RETURN(LiveJob * job, FindForWorker(job_id, token, &w));
  if (generation != job->generation) {
    return absl::FailedPreconditionError(absl::StrCat("stale rendezvous generation ", generation));
  }
  while (!job->kv.count(key) && !stop_ && !IsTerminal(job->record.state)) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  auto it = job->kv.find(key);
  if (it == job->kv.end() && (stop_ || IsTerminal(job->record.state))) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " has ended"));
  }
  if (it == job->kv.end()) {
    return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", key, "' was not set in time"));
  }
  return it->second;
}

}  // namespace qlora::coordinator
