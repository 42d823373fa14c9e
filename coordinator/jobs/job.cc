// One job's state machine and its current start (see job.h).
#include "coordinator/jobs/job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config_emit.h"
#include "common/auth/token_hash.h"
#include "common/status_macros.h"
#include "common/train_summary_text.h"

namespace qlora::coordinator {
namespace {

// "adapter written to A; merged model written to M; train_runtime ..." (what is known of it).
std::string CompletionMessage(const JobRecord& job) {
  std::vector<std::string> parts;
  if (!job.adapter_path.empty()) parts.push_back(absl::StrCat("adapter written to ", job.adapter_path));
  if (!job.merged_path.empty()) parts.push_back(absl::StrCat("merged model written to ", job.merged_path));
  if (job.summary) parts.push_back(FormatTrainSummary(*job.summary));
  return parts.empty() ? "training finished" : absl::StrJoin(parts, "; ");
}

}  // namespace

Job::Job(JobRecord record, JobConfig config, const JobEnv* env)
    : env_(env), record_(std::move(record)), config_(std::move(config)) {}

double Job::NowUnix() const { return absl::ToDoubleSeconds(env_->now() - absl::UnixEpoch()); }

// ---------------------------------------------------------------------------------------------
// State changes

absl::Status Job::Write(JobEvent event) {
  event.sequence = ++record_.last_sequence;
  event.time_unix = NowUnix();
  return env_->store->Record(record_, event);
}

void Job::Record(JobEvent event) {
  const std::string what = absl::StrCat(event.reason_code, " of job ", record_.id);
  if (absl::Status s = Write(std::move(event)); !s.ok()) {
    env_->store_failed(absl::Status(s.code(), absl::StrCat("could not record ", what, ": ", s.message())));
  }
  env_->changed();
}

absl::Status Job::RecordSubmission(const std::string& message) {
  record_.state = JobState::kQueued;
  record_.reason_code = "SUBMITTED";
  record_.message = message;
  QLORA_RETURN_IF_ERROR(Write(StateEventOf(record_)));
  env_->changed();
  return absl::OkStatus();
}

void Job::SetState(JobState state, const std::string& reason_code, const std::string& message) {
  record_.state = state;
  record_.reason_code = reason_code;
  record_.message = message;
  if (IsTerminal(state)) record_.finished_unix = NowUnix();
}

void Job::AfterTransition() {
  if (IsTerminal(record_.state) && rendezvous_) {
    rendezvous_->Close(absl::StrCat("job ", record_.id, " has ended"));
  }
  if (IsTerminal(record_.state) && env_->ended) env_->ended();
}

void Job::Transition(JobState state, const std::string& reason_code, const std::string& message) {
  SetState(state, reason_code, message);
  AfterTransition();
  Record(StateEventOf(record_));
}

void Job::Fail(const std::string& reason_code, const std::string& message) {
  if (ended()) return;
  workers_.Stop(env_->now() + env_->stop_grace);
  Transition(JobState::kFailed, reason_code, message);
}

// How long a rank's report of a failure waits for the exit of another rank that caused it.
constexpr absl::Duration kFailureSettle = absl::Seconds(2);

int Job::max_restarts() const {
  return config_.trainer.max_restarts >= 0 ? static_cast<int>(config_.trainer.max_restarts)
                                           : env_->default_max_restarts;
}

void Job::FailOrRestart(const std::string& reason_code, const std::string& message, bool retryable) {
  if (ended() || state() == JobState::kQueued) return;
  const int allowed = max_restarts();
  if (!retryable || record_.restarts >= allowed) {
    std::string why = message;
    if (!retryable && record_.restarts < allowed) absl::StrAppend(&why, " (not retried: a restart would fail the same way)");
    if (!record_.restart_causes.empty()) {
      absl::StrAppend(&why, "; gave up after ", record_.restarts, " restart(s), earlier failures: ",
                      absl::StrJoin(record_.restart_causes, "; "));
    }
    Fail(reason_code, why);
    return;
  }
  workers_.Stop(env_->now() + env_->stop_grace);
  if (rendezvous_) rendezvous_->Close("the job is restarting");
  ++record_.restarts;
  record_.restart_causes.push_back(message);
  record_.progress.clear();
  const absl::Duration backoff = std::min(env_->restart_backoff * (1 << std::min(record_.restarts - 1, 10)),
                                          absl::Minutes(5));
  not_before_ = env_->now() + backoff;
  Transition(JobState::kQueued, "RESTARTING",
             absl::StrCat("restart ", record_.restarts, " of ", allowed, " in ", absl::FormatDuration(backoff),
                          ", from the last checkpoint, after: ", message));
}

absl::Status Job::TransitionDurably(JobState state, const std::string& reason_code,
                                    const std::string& message, const std::string& what) {
  const JobRecord before = record_;
  SetState(state, reason_code, message);
  if (absl::Status written = Write(StateEventOf(record_)); !written.ok()) {
    record_ = before;
    const absl::Status failed(written.code(), absl::StrCat("could not record ", what, " of job ",
                                                           record_.id, ", so it did not take effect: ",
                                                           written.message()));
    env_->store_failed(failed);
    return failed;
  }
  AfterTransition();
  env_->changed();
  return absl::OkStatus();
}

absl::Status Job::Cancel() {
  QLORA_RETURN_IF_ERROR(TransitionDurably(JobState::kCancelled, "CANCELLED_BY_USER",
                                          "cancelled by a client", "the cancel"));
  workers_.Stop(env_->now() + env_->stop_grace);
  return absl::OkStatus();
}

void Job::Requeue() {
  record_.progress.clear();
  Transition(JobState::kQueued, "REQUEUED_AFTER_RESTART",
             "the coordinator restarted while this job ran; it is queued again");
}

// ---------------------------------------------------------------------------------------------
// Starting and watching the workers

absl::Status Job::Start(WorkerLauncher* launcher, const std::vector<int>& slots, int world,
                        WorkerLaunchRequest launch, JobShards shards) {
  start_config_yaml_ = record_.resolved_config_yaml;
  if (world != record_.num_workers) {
    JobConfig resized = config_;
    const int64_t ga = resized.trainer.gradient_accumulation_steps;
    const int64_t batch = resized.trainer.batch_size;
    const int64_t all = record_.num_workers;
    std::string how;
    if ((ga * all) % world == 0) {
      resized.trainer.gradient_accumulation_steps = ga * all / world;
      how = absl::StrCat("gradient_accumulation_steps ", ga, " -> ", ga * all / world, " keeps the global batch of ",
                         batch * ga * all, " sequences");
    } else {
      how = absl::StrCat("the global batch changes from ", batch * ga * all, " to ", batch * ga * world,
                         " sequences (gradient_accumulation_steps ", ga, " does not scale by ", all, "/", world, ")");
    }
    start_config_yaml_ = EmitResolvedJobYaml(resized);
    Transition(state(), "ELASTIC_RESIZE",
               absl::StrCat("continuing on ", world, " of ", all, " workers (min_workers ",
                            config_.backend.min_workers, "): ", how,
                            "; the last checkpoint is re-partitioned over ", world, " ranks"));
  }
  shards_ = std::move(shards);
  reported_failure_.reset();
  const absl::Time now = env_->now();
  use_gpu_ = launch.use_gpu;
  placed_on_ = launcher->Describe();
  RendezvousOptions rendezvous;
  rendezvous.generation = absl::ToUnixMicros(now);
  rendezvous.world_size = world;
  rendezvous.relay_nccl_id = use_gpu_;
  rendezvous_ = std::make_shared<Rendezvous>(rendezvous);
  workers_ = WorkerGroup();
  start_deadline_ = now + env_->register_timeout;
  record_.started_unix = NowUnix();
  record_.progress.assign(world, ProgressSnapshot{});
  GroupLaunch group;
  group.job_id = record_.id;
  group.job_uid = record_.uid;
  group.generation = rendezvous.generation;
  group.use_gpu = use_gpu_;
  group.cpus_per_worker = config_.backend.cpus_per_worker;
  group.placement = config_.backend.placement;
  std::vector<std::string> tokens;
  launch.job_id = record_.id;
  launch.world_size = world;
  for (int rank = 0; rank < world; ++rank) {
    launch.rank = rank;
    launch.slot = slots.empty() ? 0 : slots[rank];
    launch.startup_token = RandomToken();
    tokens.push_back(launch.startup_token);
    group.ranks.push_back({rank, launch.slot, BuildWorkerLaunchSpec(launch)});
  }
  QLORA_RETURN_IF_ERROR(workers_.Launch(launcher, group, tokens, now));
  Transition(JobState::kStarting, "WORKERS_STARTING",
             absl::StrCat("started ", world, use_gpu_ ? " GPU" : " CPU", " workers on ", placed_on_,
                          "; waiting for them to register"));
  return absl::OkStatus();
}

void Job::FailOnExit(const WorkerExit& exit) {
  const bool clean = !exit.info.signaled && exit.info.code == 0;
  if (workers_.stopping() || (clean && exit.completed)) return;
  // The rank that reported a failure ends by itself; the settle time decides (CheckDeadlines).
  if (reported_failure_.has_value() && reported_failure_->rank == exit.rank && !exit.info.signaled) return;
  std::string message =
      absl::StrCat("rank ", exit.rank, " (", exit.where, ") ended with ", exit.info.Describe(),
                   exit.completed ? "" : " before finishing", "; see `qloractl logs ", record_.id, " --rank ",
                   exit.rank, "`");
  // A failure another rank reported just before is most likely this exit's consequence.
  if (reported_failure_.has_value()) absl::StrAppend(&message, " (then ", reported_failure_->message, ")");
  reported_failure_.reset();
  FailOrRestart("WORKER_EXITED", message);
}

std::vector<int> Job::Poll() {
  std::vector<int> freed;
  for (const WorkerExit& exit : workers_.Reap()) {
    freed.push_back(exit.slot);
    if (env_->worker_exited) env_->worker_exited(exit);
    FailOnExit(exit);
  }
  workers_.KillOverdue(env_->now());
  CheckDeadlines();
  return freed;
}

void Job::CheckDeadlines() {
  const absl::Time now = env_->now();
  if (reported_failure_.has_value() && now >= reported_failure_->act_at) {
    const std::string message = reported_failure_->message;
    reported_failure_.reset();
    FailOrRestart("WORKER_FAILED", message);
  }
  if (state() == JobState::kStarting && now > start_deadline_) {
    FailOrRestart("WORKER_REGISTRATION_TIMEOUT",
         absl::StrCat("rank(s) ", rendezvous_->UnregisteredRanks(), " did not register within ",
                      absl::FormatDuration(env_->register_timeout)));
  }
  if (state() == JobState::kRunning) {
    if (const WorkerProcess* w = workers_.SilentSince(now - env_->heartbeat_timeout)) {
      FailOrRestart("WORKER_HEARTBEAT_LOST",
           absl::StrCat("rank ", w->rank, " (", w->where, ") sent no heartbeat for ",
                        absl::FormatDuration(now - w->last_heartbeat)));
    }
  }
}

void Job::Kill() {
  workers_.KillAll();
  if (rendezvous_) rendezvous_->Close("the coordinator is shutting down");
}

// ---------------------------------------------------------------------------------------------
// Worker calls

absl::Status Job::Register(WorkerProcess& worker, int rank, const std::string& host, int64_t pid) {
  if (worker.rank != rank) {
    return absl::InvalidArgumentError(absl::StrCat("token belongs to rank ", worker.rank, ", not ", rank));
  }
  if (ended()) return absl::FailedPreconditionError(absl::StrCat("job ", record_.id, " has ended"));
  QLORA_RETURN_IF_ERROR(rendezvous_->Register(rank));
  worker.last_heartbeat = env_->now();
  if (!host.empty()) worker.where = absl::StrCat("host ", host, ", pid ", pid);
  if (state() == JobState::kStarting && rendezvous_->AllRegistered()) {
    // Ranks that registered early waited in GetAssignment without heartbeats: the clock of
    // every rank starts now.
    workers_.TouchAll(env_->now());
    std::vector<std::string> places;
    for (const WorkerProcess& w : workers_.workers()) places.push_back(absl::StrCat("rank ", w.rank, ": ", w.where));
    Transition(JobState::kRunning, "ALL_WORKERS_REGISTERED",
               absl::StrCat(workers_.size(), " workers registered (", absl::StrJoin(places, "; "), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerAssignment> Job::Assignment(WorkerProcess& worker, std::string nccl_unique_id) {
  if (ended()) return absl::AbortedError(absl::StrCat("job ", record_.id, " has ended"));
  worker.last_heartbeat = env_->now();  // the heartbeat thread starts after the assignment
  WorkerAssignment a;
  a.job_id = record_.id;
  a.rank = worker.rank;
  a.world_size = workers_.size();
  a.device = use_gpu_ ? DeviceKind::kCuda : DeviceKind::kCpu;
  a.resolved_config_yaml = start_config_yaml_;
  a.train_shards = shards_.train[worker.rank];
  a.validation_shards = shards_.validation[worker.rank];
  a.nccl_unique_id = std::move(nccl_unique_id);
  a.generation = rendezvous_->generation();
  a.output_dir = record_.output_dir;
  a.job_uid = record_.uid;
  return a;
}

bool Job::Heartbeat(WorkerProcess& worker) {
  worker.last_heartbeat = env_->now();
  return ended() || workers_.stopping();
}

void Job::ReportProgress(WorkerProcess& worker, ProgressSnapshot progress) {
  if (ended()) return;
  worker.last_heartbeat = env_->now();
  progress.rank = worker.rank;
  if (static_cast<int>(record_.progress.size()) <= progress.rank) record_.progress.resize(progress.rank + 1);
  record_.progress[progress.rank] = progress;
  const std::vector<std::string> notices = std::move(progress.notices);
  progress.notices.clear();
  record_.progress[progress.rank].notices.clear();
  JobEvent e;
  e.state = record_.state;
  e.reason_code = "PROGRESS";
  e.progress = progress;
  Record(std::move(e));
  for (const std::string& notice : notices) {
    JobEvent n;
    n.state = record_.state;
    n.reason_code = "WORKER_NOTICE";
    n.message = absl::StrCat("rank ", progress.rank, ": ", notice.substr(0, 1000));
    Record(std::move(n));
  }
  CheckRecordsWithoutTarget();
}

void Job::CheckRecordsWithoutTarget() {
  int64_t without = 0, read = 0;
  for (const ProgressSnapshot& p : record_.progress) {
    without += p.total_records.without_target;
    read += p.total_records.trained + p.total_records.without_target;
  }
  if (without == 0) return;
  const DataConfig& d = config_.data;
  const double fraction = static_cast<double>(without) / static_cast<double>(read);
  const std::string what = absl::StrFormat(
      "%d of %d records read so far (%.1f%%) left no target after cutting to "
      "data.max_sequence_length (%d) and are not trained on",
      without, read, 100 * fraction, d.max_sequence_length);
  if (read >= kRecordsToJudge && fraction > d.max_without_target_fraction) {
    FailOrRestart("RECORDS_WITHOUT_TARGET",
                  absl::StrFormat("%s, more than data.max_without_target_fraction (%g): raise "
                                  "max_sequence_length or shorten the prompts",
                                  what, d.max_without_target_fraction),
                  /*retryable=*/false);
    return;
  }
  if (warned_without_target_ > 0 && without < 2 * warned_without_target_) return;
  warned_without_target_ = without;
  JobEvent e;
  e.state = record_.state;
  e.reason_code = "RECORDS_WITHOUT_TARGET";
  e.message = absl::StrCat(what, ": raise max_sequence_length or shorten the prompts; "
                                 "data.max_without_target_fraction fails a job above a share");
  Record(std::move(e));
}

absl::Status Job::ReportCompletion(WorkerProcess& worker, const WorkerCompletion& completion) {
  if (ended() || state() == JobState::kQueued) return absl::OkStatus();  // a stopped start's
  if (completion.ok) {
    for (const auto& [reported, planned] :
         {std::pair{completion.adapter_path, record_.output_dir + "/adapter"},
          std::pair{completion.merged_path, record_.output_dir + "/merged"}}) {
      if (!reported.empty() && reported != planned) {
        return absl::PermissionDeniedError(absl::StrCat(
            "rank ", worker.rank, " reported an output outside the job's output folder (",
            reported.substr(0, 256), "; expected ", planned, ")"));
      }
    }
  }
  if (!completion.ok) {
    const std::string message = absl::StrCat("rank ", worker.rank, ": ", completion.error);
    if (!completion.retryable) {
      FailOrRestart("WORKER_FAILED", message, /*retryable=*/false);
    } else if (!reported_failure_.has_value()) {
      reported_failure_ = ReportedFailure{worker.rank, message, env_->now() + kFailureSettle};
    }
    return absl::OkStatus();
  }
  const JobRecord before = record_;
  worker.completed = true;
  if (worker.rank == 0) {
    if (!completion.adapter_path.empty()) record_.adapter_path = completion.adapter_path;
    if (!completion.merged_path.empty()) record_.merged_path = completion.merged_path;
    if (completion.summary) record_.summary = completion.summary;
  }
  if (!workers_.AllCompleted()) return absl::OkStatus();
  std::string message = CompletionMessage(record_);
  const std::string records = RecordSummary(record_.progress);
  if (!records.empty()) absl::StrAppend(&message, "; ", records);
  // The last rank is told its completion is taken only once the success is stored; otherwise
  // nothing of it stands (the rank may report again).
  if (absl::Status recorded =
          TransitionDurably(JobState::kSucceeded, "COMPLETED", message, "the success");
      !recorded.ok()) {
    record_ = before;
    worker.completed = false;
    return recorded;
  }
  // A rank stuck in its exit (e.g. a CUDA/NCCL teardown) must not hold its slot forever.
  workers_.ExpectExit(env_->now() + 10 * env_->stop_grace);
  return absl::OkStatus();
}

}  // namespace qlora::coordinator
