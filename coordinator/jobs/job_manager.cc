// The coordinator's core: the jobs, the queue, the monitor thread and the authentication of
// worker calls (see job_manager.h).
#include "coordinator/jobs/job_manager.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config_emit.h"
#include "common/config/job_config_parser.h"
#include "common/posix_files.h"
#include "common/status_macros.h"
#include "coordinator/admission/data_sample_check.h"
#include "coordinator/admission/dataset_check.h"
#include "coordinator/admission/model_check.h"
#include "coordinator/admission/output_dir_check.h"
#include "coordinator/jobs/resume_plan.h"
#include "common/config/yaml_overrides.h"
#include "common/tracking/mlflow_client.h"
#include "coordinator/launch/worker_launch.h"

namespace qlora::coordinator {
namespace {

// 128 random bits in hex: a job's identity that no other job ever shares.
std::string NewJobUid() {
  absl::BitGen random;  // seeded from the OS's entropy
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(random), absl::Uniform<uint64_t>(random));
}

// N of a job id or folder name "job-N"; nullopt for anything else.
std::optional<int64_t> JobNumber(const char* name) {
  int64_t number = 0;
  char tail = 0;
  if (sscanf(name, "job-%" SCNd64 "%c", &number, &tail) != 1) return std::nullopt;
  return number;
}

// 1 + the highest N of the job-N folders in `jobs_dir` (1 when there are none).
int64_t NextJobNumberAfterFolders(const std::string& jobs_dir) {
  int64_t next = 1;
  DIR* d = ::opendir(jobs_dir.c_str());
  if (d == nullptr) return next;
  while (const dirent* e = ::readdir(d)) {
    if (std::optional<int64_t> number = JobNumber(e->d_name)) next = std::max(next, *number + 1);
  }
  ::closedir(d);
  return next;
}

// Whether the job's workers run on the coordinator's Ray cluster (else as local processes).
bool OnCluster(const JobConfig& config) { return config.backend.type == BackendType::kRay; }

}  // namespace

JobManager::JobManager(JobManagerOptions options, JobStore* store, ProcessLauncher* processes,
                       WorkerLauncher* cluster)
    : options_(std::move(options)),
      total_slots_(SlotPool(options_.gpus, options_.cpu_workers).total()),
      local_(processes, static_cast<int>(options_.gpus.size())),
      cluster_(cluster),
      env_{store,
           options_.now,
           options_.register_timeout,
           options_.heartbeat_timeout,
           options_.stop_grace,
           [this] { changed_.SignalAll(); },
           [this](const absl::Status& status) { StoreFailed(status); },
           options_.default_max_restarts,
           options_.restart_backoff,
           options_.on_worker_exit,
           [this] {  // called by a job under mu_
             mu_.AssertHeld();
             housekeeping_due_ = true;
           }},
      slots_(options_.gpus, options_.cpu_workers) {}

JobManager::~JobManager() { Shutdown(); }

std::vector<std::string> JobManager::ReadRoots() const {
  // Resolved first, then a root as written where it differs (a link): each once, so that a
  // refusal lists each root once.
  std::vector<std::string> roots = options_.roots.read;
  for (const std::string& written : options_.roots.read_as_written) {
    if (std::find(roots.begin(), roots.end(), written) == roots.end()) roots.push_back(written);
  }
  return roots;
}

std::string JobManager::JobDir(const std::string& id) const {
  return absl::StrCat(options_.state_dir, "/jobs/", id);
}

absl::StatusOr<int> JobManager::Lease() {
  absl::MutexLock lock(&mu_);
  if (slots_.total() == 0) {
    return absl::FailedPreconditionError("this coordinator has no local worker slots to generate on");
  }
  const std::vector<int> free = slots_.Free();
  if (free.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "every one of this host's ", slots_.total(), slots_.gpu() ? " GPUs" : " worker slots",
        " is busy; generation needs one free"));
  }
  slots_.Take(free.front());
  return free.front();
}

void JobManager::Return(int slot) {
  absl::MutexLock lock(&mu_);
  slots_.Release(slot);
  changed_.SignalAll();  // a queued job may start now
}

WorkerLaunchRequest JobManager::LaunchBasics() const {
  WorkerLaunchRequest launch;
  launch.worker_binary = options_.worker_binary;
  launch.extra_env = options_.worker_env;
  launch.use_gpu = !options_.gpus.empty();
  launch.threads_per_worker = std::max(1, local_.Capacity().cpus);
  {
    absl::MutexLock lock(&mu_);
    launch.coordinator_address = coordinator_address_;
  }
  if (options_.confine_workers && (!options_.roots.read.empty() || !options_.roots.output.empty())) {
    launch.confine_read = options_.roots.read;
    launch.confine_write = {options_.state_dir};
  }
  return launch;
}

void JobManager::SetCoordinatorAddress(std::string address) {
  absl::MutexLock lock(&mu_);
  coordinator_address_ = std::move(address);
}

Job& JobManager::Add(std::unique_ptr<Job> job) {
  // New ids continue after the stored ones.
  if (std::optional<int64_t> number = JobNumber(job->id().c_str())) {
    next_job_number_ = std::max(next_job_number_, *number + 1);
  }
  Job& ref = *job;
  order_.push_back(job->id());
  jobs_[job->id()] = std::move(job);
  return ref;
}

absl::Status JobManager::Load() {
  QLORA_RETURN_IF_ERROR(MakeDirs(options_.state_dir + "/jobs"));
  QLORA_ASSIGN_OR_RETURN(std::vector<JobRecord> stored, env_.store->LoadJobs());
  // Job folders the store does not know (a lost or replaced store) keep their numbers: a new job
  // never gets an old job's id, so never its folder, outputs or checkpoints to resume.
  const int64_t after_folders = NextJobNumberAfterFolders(options_.state_dir + "/jobs");
  // Forgotten jobs (retention) left neither rows nor folders: the store keeps their numbers.
  QLORA_ASSIGN_OR_RETURN(const int64_t after_forgotten, env_.store->NextJobNumber());
  absl::MutexLock lock(&mu_);
  next_job_number_ = std::max({next_job_number_, after_folders, after_forgotten});
  for (JobRecord& record : stored) {
    // Only a job that may still run needs its config: it is parsed once, here.
    absl::StatusOr<JobConfig> config = IsTerminal(record.state)
                                           ? JobConfig{}
                                           : ParseResolvedJobConfig(record.resolved_config_yaml);
    Job& job = Add(std::make_unique<Job>(std::move(record), config.ok() ? *config : JobConfig{}, &env_));
    if (!config.ok()) {
      job.Fail("START_FAILED", std::string(config.status().message()));
    } else if (job.state() == JobState::kStarting || job.state() == JobState::kRunning) {
      job.Requeue();
    }
  }
  return absl::OkStatus();
}

void JobManager::StoreFailed(const absl::Status& status) {
  mu_.AssertHeld();
  fprintf(stderr, "qlora-coordinator: job store: %s\n", std::string(status.message()).c_str());
  if (!store_error_.ok()) return;
  store_error_ = status;
  fprintf(stderr,
          "qlora-coordinator: UNHEALTHY until restarted (health NOT_SERVING): the job store no "
          "longer holds every state change; new jobs are refused and queued jobs wait. Free the "
          "store's disk and restart the coordinator.\n");
  if (options_.on_unhealthy) options_.on_unhealthy(status);
}

absl::Status JobManager::Health() const {
  absl::MutexLock lock(&mu_);
  return store_error_;
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
    for (auto& [id, job] : jobs_) job->Kill();
    changed_.SignalAll();
  }
  if (monitor_.joinable()) monitor_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, job] : jobs_) job->ReapKilled();  // nothing is left as a zombie
}

// ---------------------------------------------------------------------------------------------
// Clients

namespace {

// A continued job submitted without a job file runs the other's resolved file (datasets and
// paths absolute as they were), less the checkpoint that job itself may have continued from.
absl::StatusOr<SubmitRequest> WithContinuedJobFile(const SubmitRequest& request) {
  if (!request.continues.has_value() || !request.job_yaml.empty()) return request;
  SubmitRequest out = request;
  QLORA_ASSIGN_OR_RETURN(out.job_yaml,
                         ApplyOverrides(request.continues->resolved_config_yaml,
                                        {{{"trainer", "resume_from_checkpoint"}, "\"\""}}));
  out.source_name = absl::StrCat(request.continues->id, "'s resolved job file");
  out.base_dir.clear();
  if (out.name.empty()) out.name = request.continues->name;
  return out;
}

}  // namespace

absl::StatusOr<JobConfig> JobManager::ParseSubmission(const SubmitRequest& request, std::string* note) const {
  ParseOptions parse;
  parse.source_name = request.source_name;
  parse.dataset_override = request.dataset;
  parse.validation_dataset_override = request.validation_dataset;
  parse.hf_hub_cache = options_.hf_hub_cache;
  parse.base_dir = request.base_dir;
  parse.name_override = request.name;
  // Nothing outside the read roots is looked at, not even stat'ed (an existence oracle).
  parse.before_touching = [this](absl::string_view field, const std::string& path) {
    return CheckPathWithinReadRoots(field, path, options_.roots);
  };
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseJobConfig(request.job_yaml, parse));
  // File-system work, all before the lock; links are followed and checked before any file is
  // opened (Parquet footers are read by CheckDatasetFiles).
  if (!config.output_dir.empty()) {
    QLORA_ASSIGN_OR_RETURN(config.output_dir, ResolveOutputDir(config.output_dir, options_.state_dir));
  }
  QLORA_RETURN_IF_ERROR(CheckJobPathsConfined(config, options_.roots));
  QLORA_RETURN_IF_ERROR(CheckDatasetFiles(config.data, ReadRoots()));  // may be slow
  QLORA_RETURN_IF_ERROR(CheckDataSample(config, ReadRoots()));       // the first records
  // Local workers inherit this process's environment, where MLflow's client settings live.
  if (config.trainer.report_to_mlflow) {
    QLORA_RETURN_IF_ERROR(tracking::MlflowSettingsFromEnvironment().status());
  }
  QLORA_RETURN_IF_ERROR(CheckBaseModelConfig(config.base_model_path, &config.lora, ReadRoots()));
  if (request.continues.has_value()) {
    QLORA_ASSIGN_OR_RETURN(const ResumePlan plan, PlanResume(*request.continues, EmitResolvedJobYaml(config)));
    config.trainer.resume_from_checkpoint = plan.checkpoint;
    if (note != nullptr) *note = plan.statement;
  }
  // The resolved file says how many restarts the job has.
  if (config.trainer.max_restarts < 0) config.trainer.max_restarts = options_.default_max_restarts;
  if (OnCluster(config)) {
    if (cluster_ == nullptr) {
      return absl::FailedPreconditionError(
          "backend.type: ray, but this coordinator has no Ray cluster: start qlora-coordinator with "
          "--ray-address http://HEAD:8265 (and --advertise-address HOST:PORT that the cluster's hosts "
          "can reach), or set backend.type: local to run on this host");
    }
    const LauncherCapacity capacity = cluster_->Capacity();
    if (config.backend.num_workers == 0) {
      if (!config.backend.use_gpu || !capacity.known || capacity.gpus == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "backend.trainer.num_workers: set how many workers to place on ", cluster_->Describe(),
            config.backend.use_gpu ? " (its GPUs are not known yet)" : " (CPU workers)"));
      }
      config.backend.num_workers = capacity.gpus;
    }
    const int need = config.backend.num_workers;
    if (capacity.known && config.backend.use_gpu && need > capacity.gpus) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backend.trainer.num_workers: the job asks for ", need, " GPU workers but ", cluster_->Describe(),
          " has ", capacity.gpus, " GPUs"));
    }
    if (capacity.known && !config.backend.use_gpu && need * config.backend.cpus_per_worker > capacity.cpus) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backend.trainer.num_workers: the job asks for ", need, " workers of ",
          config.backend.cpus_per_worker, " CPUs but ", cluster_->Describe(), " has ", capacity.cpus, " CPUs"));
    }
    return config;
  }
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

bool JobManager::RunsOnGpus(const JobConfig& config) const {
  if (OnCluster(config)) return config.backend.use_gpu;
  return config.backend.use_gpu && !options_.gpus.empty();  // no GPUs here: CPU workers
}

absl::StatusOr<std::string> JobManager::Validate(const SubmitRequest& submitted) const {
  QLORA_ASSIGN_OR_RETURN(const SubmitRequest request, WithContinuedJobFile(submitted));
  std::string continues;
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseSubmission(request, &continues));
  const bool ray = OnCluster(config);
  const int workers = config.backend.num_workers > 0 ? config.backend.num_workers : total_slots_;
  std::string where = absl::StrCat(
      "# runs on: ", ray ? cluster_->Describe() : local_.Describe(), ", ", workers,
      RunsOnGpus(config) ? " GPU workers" : " CPU workers");
  if (ray) {
    absl::StrAppend(&where, " (", config.backend.cpus_per_worker, " CPU", RunsOnGpus(config) ? " + 1 GPU" : "",
                    " each), placement ", EnumName(config.backend.placement));
  } else if (config.backend.use_gpu && options_.gpus.empty()) {
    absl::StrAppend(&where, " (use_gpu: true, but this coordinator has no GPUs)");
  }
  if (!continues.empty()) absl::StrAppend(&where, "\n# ", continues);
  return absl::StrCat(where, "\n", EmitResolvedJobYaml(config));
}

absl::StatusOr<JobRecord> JobManager::Submit(const SubmitRequest& submitted) {
  QLORA_ASSIGN_OR_RETURN(const SubmitRequest request, WithContinuedJobFile(submitted));
  std::string continues;
  QLORA_ASSIGN_OR_RETURN(JobConfig config, ParseSubmission(request, &continues));
  JobRecord r;
  r.name = config.name;
  r.owner = request.owner;
  r.job_yaml = request.job_yaml;
  r.resolved_config_yaml = EmitResolvedJobYaml(config);
  r.num_workers = config.backend.num_workers > 0 ? config.backend.num_workers : total_slots_;
  r.zero_stage = config.backend.strategy.zero_stage;
  r.uid = NewJobUid();  // before the lock: it draws on the OS's entropy
  const std::string accepted = absl::StrCat("accepted; ", r.num_workers, " workers, ZeRO stage ", r.zero_stage,
                                            continues.empty() ? "" : "; ", continues);
  absl::MutexLock lock(&mu_);
  if (!store_error_.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the coordinator is unhealthy and accepts no job until it is restarted: ",
        store_error_.message()));
  }
  int64_t queued = 0, queued_by_owner = 0;
  for (const std::string& id : order_) {
    const JobRecord& other = jobs_.at(id)->record();
    if (other.state != JobState::kQueued) continue;
    ++queued;
    if (other.owner == request.owner) ++queued_by_owner;
  }
  if (queued >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        queued, " jobs are queued, the coordinator's limit (--max-queued-jobs); try again once some "
        "have started"));
  }
  if (options_.max_queued_jobs_per_user > 0 && queued_by_owner >= options_.max_queued_jobs_per_user) {
    return absl::ResourceExhaustedError(absl::StrCat(
        request.owner, " has ", queued_by_owner, " jobs queued, the limit per user "
        "(--max-queued-jobs-per-user); try again once some have started"));
  }
  if (!config.output_dir.empty()) {
    std::vector<std::string> taken;
    for (const std::string& id : order_) taken.push_back(jobs_.at(id)->record().output_dir);
    QLORA_RETURN_IF_ERROR(CheckOutputDirIsFree(config.output_dir, taken));
  }
  r.id = absl::StrFormat("job-%06d", next_job_number_);  // taken by Add once recorded
  r.created_unix = absl::ToDoubleSeconds(options_.now() - absl::UnixEpoch());
  r.output_dir = config.output_dir.empty() ? JobDir(r.id) + "/output" : config.output_dir;
  auto job = std::make_unique<Job>(std::move(r), std::move(config), &env_);
  if (absl::Status recorded = job->RecordSubmission(accepted); !recorded.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the job store could not record the new job: ", recorded.message()));
  }
  return Add(std::move(job)).record();  // the monitor thread, woken by the event, schedules it
}

absl::StatusOr<Job*> JobManager::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second.get();
}

absl::StatusOr<JobRecord> JobManager::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(const Job* job, Find(id));
  JobRecord record = job->record();
  if (job->job_files_dropped()) {
    QLORA_RETURN_IF_ERROR(
        env_.store->LoadJobFiles(id, &record.job_yaml, &record.resolved_config_yaml));
  }
  return record;
}

absl::Status JobManager::FillJobFiles(JobRecord* record) const {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(const Job* job, Find(record->id));
  if (!job->job_files_dropped()) return absl::OkStatus();
  return env_.store->LoadJobFiles(record->id, &record->job_yaml, &record->resolved_config_yaml);
}

absl::StatusOr<std::vector<JobRecord>> JobManager::List(const std::set<JobState>& states,
                                                        const std::optional<std::string>& owner,
                                                        int page_size, const std::string& after_id,
                                                        std::string* next_id) const {
  absl::MutexLock lock(&mu_);
  size_t start = 0;
  if (!after_id.empty()) {
    auto at = std::find(order_.begin(), order_.end(), after_id);
    if (at == order_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("page token names no job (", after_id, ")"));
    }
    start = static_cast<size_t>(at - order_.begin()) + 1;
  }
  std::vector<JobRecord> out;
  next_id->clear();
  for (size_t i = start; i < order_.size(); ++i) {
    const JobRecord& r = jobs_.at(order_[i])->record();
    if (!states.empty() && !states.count(r.state)) continue;
    if (owner.has_value() && r.owner != *owner) continue;
    if (static_cast<int>(out.size()) == page_size) {
      *next_id = out.back().id;  // more follow
      break;
    }
    out.push_back(r);
  }
  return out;
}

ManagerSnapshot JobManager::Snapshot() const {
  ManagerSnapshot snapshot;
  absl::MutexLock lock(&mu_);
  snapshot.jobs.reserve(order_.size());
  for (const std::string& id : order_) {
    JobRecord r = jobs_.at(id)->record();
    r.job_yaml.clear();
    r.resolved_config_yaml.clear();
    snapshot.jobs.push_back(std::move(r));
  }
  snapshot.slots_total = slots_.total();
  snapshot.slots_busy = slots_.total() - static_cast<int>(slots_.Free().size());
  snapshot.gpu = slots_.gpu();
  return snapshot;
}

absl::StatusOr<JobRecord> JobManager::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(Job * job, Find(id));
  if (job->ended()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " has already ended (", JobStateName(job->state()), ")"));
  }
  QLORA_RETURN_IF_ERROR(job->Cancel());
  return job->record();
}

absl::StatusOr<std::vector<JobEvent>> JobManager::WaitEvents(const std::string& id,
                                                             int64_t after_sequence,
                                                             absl::Time deadline,
                                                             bool* terminal) const {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(const Job* job, Find(id));
  while (job->record().last_sequence <= after_sequence && !job->ended() && !stop_) {
    const bool timed_out = changed_.WaitWithDeadline(&mu_, deadline);
    // Looked up again: retention may have forgotten the job while this waited.
    QLORA_ASSIGN_OR_RETURN(job, Find(id));
    if (timed_out) break;
  }
  const JobRecord& r = job->record();
  *terminal = job->ended();
  if (stop_ && r.last_sequence <= after_sequence) {
    return absl::UnavailableError("the coordinator is shutting down; watch again to resume");
  }
  if (r.last_sequence <= after_sequence) return std::vector<JobEvent>{};
  QLORA_ASSIGN_OR_RETURN(std::vector<JobEvent> events, env_.store->LoadEvents(id, after_sequence));
  if (events.empty() || events.back().sequence < r.last_sequence) {
    // The latest events could not be stored (the coordinator is unhealthy): the job's current
    // state stands in for them, so that a watcher moves on instead of asking again at once.
    events.push_back(StateEventOf(r));
  }
  return events;
}

absl::StatusOr<std::string> JobManager::LogPath(const std::string& id, int rank) const {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(const Job* job, Find(id));
  const int workers = job->record().num_workers;
  if (rank < 0 || rank >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in job ", id, " (", workers, " workers)"));
  }
  return WorkerLogPath(JobDir(id), rank);
}

// ---------------------------------------------------------------------------------------------
// Scheduling and the monitor

std::optional<StartRequest> JobManager::NextStart() {
  // Unhealthy: a start and its outcome might not be recorded; queued jobs wait for a restart.
  if (!store_error_.ok()) return std::nullopt;
  // Strict FIFO among the jobs that need this host's slots: the oldest starts first, later
  // ones wait behind it. A Ray job takes no slot here: it starts at once, and the cluster's
  // placement group waits for room (within the registration deadline).
  bool local_blocked = false;
  for (const std::string& id : order_) {
    Job& job = *jobs_.at(id);
    if (job.state() != JobState::kQueued) continue;
    const bool ray = OnCluster(job.config());
    if (local_blocked && !ray) continue;
    // A restarting job waits for its backoff and for its old workers to be gone; it keeps its
    // place at the head of the queue meanwhile.
    if (job.not_before() > options_.now() || job.workers().AnyAlive()) {
      local_blocked = local_blocked || !ray;
      continue;
    }
    int need = job.record().num_workers;
    const int min_workers = job.config().backend.min_workers;
    if (ray) {
      if (cluster_ == nullptr) {  // stored by a coordinator that had one
        job.Fail("NO_RAY_CLUSTER", "backend.type: ray, but this coordinator was restarted without "
                                   "--ray-address; submit it again with backend.type: local, or "
                                   "restart the coordinator with --ray-address");
        continue;
      }
      // Elastic: a cluster that has lost nodes for good places as many as it now holds.
      const LauncherCapacity capacity = cluster_->Capacity();
      int holds = job.config().backend.use_gpu ? capacity.gpus
                                               : capacity.cpus / std::max(1, job.config().backend.cpus_per_worker);
      if (job.config().backend.placement == PlacementStrategy::kStrictSpread) holds = std::min(holds, capacity.hosts);
      if (min_workers > 0 && capacity.known && holds < need && holds >= min_workers) need = holds;
      return StartRequest{id, {}, job.config().data, need, JobDir(id) + "/logs",
                          job.record().output_dir, ReadRoots()};
    }
    if (need > total_slots_) {  // e.g. queued again after a restart with fewer GPUs
      if (min_workers > 0 && total_slots_ >= min_workers) {
        need = total_slots_;  // elastic: go on with the workers this coordinator has
      } else {
        job.Fail("NOT_ENOUGH_WORKERS",
                 absl::StrCat("the job needs ", need, " workers; this coordinator has ", total_slots_,
                              min_workers > 0 ? absl::StrCat(" (min_workers ", min_workers, ")") : ""));
        continue;
      }
    }
    std::vector<int> free = slots_.Free();
    if (static_cast<int>(free.size()) < need) {
      WaitForSlots(job, static_cast<int>(free.size()));
      local_blocked = true;
      continue;
    }
    free.resize(need);
    return StartRequest{id, std::move(free), job.config().data, need, JobDir(id) + "/logs",
                        job.record().output_dir, ReadRoots()};
  }
  return std::nullopt;
}

void JobManager::StartPrepared(const StartRequest& request, absl::StatusOr<JobShards> prepared) {
  // While mu_ was released the job may have been cancelled, or slots freed: ask the FIFO again.
  std::optional<StartRequest> now = NextStart();
  // The next Tick prepares what it calls for (another job, or another world size).
  if (!now || now->job_id != request.job_id || now->world_size != request.world_size) return;
  Job& job = *jobs_.at(request.job_id);
  if (!prepared.ok()) {
    job.Fail("START_FAILED", std::string(prepared.status().message()));
    return;
  }
  StartJob(job, std::move(now->slots), now->world_size, *std::move(prepared));
}

void JobManager::WaitForSlots(Job& job, int free) {
  std::vector<std::string> holders;  // jobs with a live worker process
  for (const std::string& other : order_) {
    const Job& holder = *jobs_.at(other);
    if (!OnCluster(holder.config()) && holder.workers().AnyAlive()) {
      holders.push_back(other);
    }
  }
  const std::string message = absl::StrCat(
      "waiting for workers: needs ", job.record().num_workers, ", ", free, " of ", total_slots_,
      " free", holders.empty() ? "" : absl::StrCat(" (held by ", absl::StrJoin(holders, ", "), ")"));
  if (job.record().reason_code != "WAITING_FOR_WORKERS" || job.record().message != message) {
    job.Transition(JobState::kQueued, "WAITING_FOR_WORKERS", message);
  }
}

void JobManager::StartJob(Job& job, std::vector<int> slots, int world, JobShards shards) {
  const bool ray = OnCluster(job.config());
  WorkerLaunchRequest launch;
  launch.worker_binary = options_.worker_binary;
  launch.coordinator_address = coordinator_address_;
  launch.extra_env = options_.worker_env;
  launch.job_dir = JobDir(job.id());
  launch.use_gpu = RunsOnGpus(job.config());
  if (options_.confine_workers && (!options_.roots.read.empty() || !options_.roots.output.empty())) {
    launch.confine_read = options_.roots.read;
    launch.confine_write = {job.record().output_dir};
  }
  // A local CPU worker shares this host's cores with the job's others; a Ray worker has its bundle's.
  launch.threads_per_worker =
      ray ? job.config().backend.cpus_per_worker
          : std::max(1, local_.Capacity().cpus / std::max(1, world));
  absl::Status started = job.Start(ray ? cluster_ : &local_, slots, world, std::move(launch), std::move(shards));
  // Every launched local worker holds its slot until its end is seen.
  if (!ray) {
    for (const WorkerProcess& w : job.workers().workers()) slots_.Take(w.slot);
  }
  if (!started.ok()) job.Fail("START_FAILED", std::string(started.message()));
}

int JobManager::ForgetEndedJobs() {
  const int keep = options_.max_ended_jobs_per_user;
  const absl::Duration max_age = options_.ended_job_retention;
  if (keep <= 0 && max_age <= absl::ZeroDuration()) return 0;
  const double now = absl::ToDoubleSeconds(options_.now() - absl::UnixEpoch());
  // Each user's ended jobs whose workers are all gone, newest end first (the later submitted
  // first among equal ends).
  std::map<std::string, std::vector<const JobRecord*>> ended;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const Job& job = *jobs_.at(*it);
    if (job.ended() && !job.workers().AnyAlive()) ended[job.record().owner].push_back(&job.record());
  }
  std::set<std::string> victims;
  for (auto& [owner, records] : ended) {
    std::stable_sort(records.begin(), records.end(), [](const JobRecord* a, const JobRecord* b) {
      return a->finished_unix > b->finished_unix;
    });
    for (size_t k = 0; k < records.size(); ++k) {
      const bool too_many = keep > 0 && k >= static_cast<size_t>(keep);
      const bool too_old = max_age > absl::ZeroDuration() && records[k]->finished_unix > 0 &&
                           now - records[k]->finished_unix > absl::ToDoubleSeconds(max_age);
      if (too_many || too_old) victims.insert(records[k]->id);
    }
  }
  if (victims.empty()) return 0;
  std::vector<std::string> folders;
  for (const std::string& id : victims) {
    const absl::Status forgotten = env_.store->ForgetJob(id, next_job_number_);
    if (!forgotten.ok()) {
      // Kept, to be tried again at the next pass; the store's trouble shows in the next write.
      fprintf(stderr, "qlora-coordinator: retention: could not forget %s: %s\n", id.c_str(),
              std::string(forgotten.message()).c_str());
      break;
    }
    jobs_.erase(id);
    folders.push_back(JobDir(id));
  }
  order_.erase(std::remove_if(order_.begin(), order_.end(),
                              [&](const std::string& id) { return jobs_.count(id) == 0; }),
               order_.end());
  // The folders may be large: removed without the lock every client call needs.
  mu_.Unlock();
  for (const std::string& folder : folders) {
    std::error_code ec;
    std::filesystem::remove_all(folder, ec);
  }
  mu_.Lock();
  return static_cast<int>(folders.size());
}

void JobManager::DropEndedJobFiles() {
  if (!store_error_.ok()) return;  // the store may not hold the latest ends
  for (auto& [id, job] : jobs_) {
    if (job->ended() && !job->job_files_dropped()) job->DropJobFiles();
  }
}

bool JobManager::Tick() {
  // Retention and the job-file drop look at every job: only after a job ended or its workers
  // were reaped, and on an age tick for ended_job_retention (and retries).
  const absl::Time now = options_.now();
  if (housekeeping_due_ || now - last_housekeeping_ >= kHousekeepingInterval) {
    housekeeping_due_ = false;
    last_housekeeping_ = now;
    DropEndedJobFiles();
    ForgetEndedJobs();
  }
  if (stop_) return false;
  for (const std::string& id : order_) {
    Job& job = *jobs_.at(id);
    if (job.workers().empty()) continue;
    const std::vector<int> freed = job.Poll();
    if (!freed.empty() && job.ended()) housekeeping_due_ = true;  // its workers are gone now
    if (OnCluster(job.config())) continue;  // holds no slot here
    for (int slot : freed) slots_.Release(slot);
  }
  std::optional<StartRequest> next = NextStart();
  if (!next) return false;
  // Planning reads the job's datasets and the folders may be anywhere the job names: either
  // may block, so neither runs under the lock that every client call needs.
  mu_.Unlock();
  absl::StatusOr<JobShards> prepared = PrepareStart(*next);
  mu_.Lock();
  if (stop_) return false;
  StartPrepared(*next, std::move(prepared));
  return true;
}

void JobManager::PollOnce() {
  absl::MutexLock lock(&mu_);
  while (!stop_ && Tick()) {
  }
}

void JobManager::MonitorLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (Tick()) continue;  // a start was tried: the next queued job may fit at once
    changed_.WaitWithTimeout(&mu_, options_.poll_interval);
  }
}

}  // namespace qlora::coordinator
